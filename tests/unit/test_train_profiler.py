"""profile_steps (dockyard.train.profiler): the setting's values, the host's check against max_steps, and how busy
the GPU was read from a trace. The trace here is written by this test in the format torch.profiler exports (Kineto's
Chrome trace: CPU operators, and `kernel` / `gpu_memcpy` events on CUDA streams), since this machine has no GPU;
tests/gpu/test_recipes_gpu.py reads a real one."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from dockyard.common.errors import DockyardError
from dockyard.common.kernels import gpu_time, kernel_kind
from dockyard.common.recipes import load_recipe
from dockyard.common.run_settings import resolve_settings
from dockyard.launch.preflight import check_overrides
from dockyard.train.profiler import write


@pytest.mark.parametrize("given, steps", [(5, (5, 5)), ("5", (5, 5)), ("20-22", (20, 22)), (" 3 - 12 ", (3, 12))])
def test_profile_steps_names_one_step_or_a_range(given, steps):
    settings, _ = resolve_settings(load_recipe("ddp"), {"profile_steps": given})
    assert settings.profiled == steps


@pytest.mark.parametrize("given, says", [
    ("0", "steps count from 1"), ("9-3", "a range runs upwards"), ("1-11", "profile at most 10"),
    ("a-b", "not a step or a range"), ("5-", "not a step or a range"), ("-5", "not a step or a range"),
    (True, "was given no value"), (False, "not a step or a range"), (2.5, "not a step or a range"),
    ("²", "not a step or a range"),
])
def test_a_profile_steps_that_names_no_steps_is_refused_saying_what_to_give(given, says):
    with pytest.raises(DockyardError, match="profile_steps") as e:
        resolve_settings(load_recipe("ddp"), {"profile_steps": given})
    assert says in str(e.value) and "e.g. 20-22" in str(e.value)


@pytest.mark.parametrize("given, quoted", [
    ("abc", "'abc'"), ("x" * 40, repr("x" * 40)), ("5-1", "'5-1'"), ("1-50", "'1-50'"), (0, "0"), ([1, 2], "[1, 2]"),
    ("1-" + "1" * 40, repr("1-" + "1" * 40)), ("7" * 5000, "a number of 5,000 digits"), (True, ""),
])
def test_a_profile_steps_refusal_says_its_value_once_as_every_setting_s(given, quoted):
    """Its validator quoted the value as well as the settings' formatter (`--profile_steps: 'abc' is not ...`; past
    reprlib's 30 characters both quoted it: twice), a bare `--profile_steps` was `--profile_steps True: --profile_steps
    was given no value`, and a step of 5,000 digits was Python's "Exceeds the limit (4300 digits) for integer string
    conversion ... use sys.set_int_max_str_digits()". Now each is `--profile_steps 'value': what is wrong; what to
    give`, the value once (none for a bare flag), one short line."""
    with pytest.raises(DockyardError) as e:
        resolve_settings(load_recipe("ddp"), {"profile_steps": given})
    said = str(e.value)
    assert said.startswith(f"invalid setting: --profile_steps{' ' + quoted if quoted else ''}: "), said
    assert "e.g. 20-22" in said and "\n" not in said and len(said) < 250, said
    assert not quoted or len(re.findall(rf"(?<![\w-]){re.escape(quoted)}(?![\w-])", said)) == 1, said
    if isinstance(given, str):  # reprlib's cut of it, besides the formatter's, said it twice
        assert said.count("'" + given[:20]) == quoted.startswith("'"), said
    assert "True" not in said and "set_int_max_str_digits" not in said, said


def test_the_host_refuses_steps_past_the_runs_last_before_it_starts():
    check_overrides(load_recipe("ddp"), ["--max_steps", "50", "--profile_steps", "48-50"])
    with pytest.raises(DockyardError, match=r"profile_steps 48-52 runs past the run's last step \(max_steps 50\)"):
        check_overrides(load_recipe("ddp"), ["--max_steps", "50", "--profile_steps", "48-52"])
    check_overrides(load_recipe("ddp"), ["--max_steps", "-1", "--num_train_epochs", "2", "--profile_steps", "48-52"])


def op(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def kernel(name, ts, dur, stream=7, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream}


def test_gpu_busy_is_the_time_any_kernel_ran_each_overlap_counted_once():
    trace = {"traceEvents": [
        op("aten::mm", 1000.0, 400.0),  # the profiled span: 1000 to 1400 µs
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 1010.0, 100.0),
        kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1050.0, 150.0, stream=20),  # beside the gemm
        kernel("flash_fwd_kernel", 1250.0, 50.0),
        kernel("Memcpy HtoD (Pageable -> Device)", 1320.0, 30.0, cat="gpu_memcpy"),
        {"ph": "i", "name": "a marker, no duration", "ts": 5000.0},
    ]}
    got = gpu_time(trace)
    assert got["span_us"] == 400.0
    assert got["busy_us"] == 190.0 + 50.0 + 30.0  # 1010-1200 (gemm and all-reduce overlapping), flash, the copy
    assert got["kinds"] == {"communication": 150.0, "matmul": 100.0, "attention": 50.0, "memory copies": 30.0}


class RecordedProfiler:
    """Stands in for a torch.profiler.profile that ran on a GPU (this machine has none): it exports the trace given,
    and its operator table says how it was asked to sort."""

    def __init__(self, trace):
        self.trace = trace

    def export_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump(self.trace, f)

    def key_averages(self):
        return self

    def table(self, sort_by, row_limit, max_name_column_width):
        return f"(operators by {sort_by}, {row_limit} rows)"


def test_a_gpu_profile_is_summarised_by_rank_0_and_every_rank_keeps_its_trace(tmp_path):
    trace = {"traceEvents": [op("aten::mm", 0.0, 1000.0), kernel("nvjet_tst_gemm", 100.0, 600.0),
                             kernel("void at::native::vectorized_elementwise_kernel", 700.0, 100.0)]}
    assert write(RecordedProfiler(trace), tmp_path / "profile", (20, 21), 1.5, 1, 2) is None
    assert json.loads(gzip.decompress((tmp_path / "profile" / "trace-rank1.json.gz").read_bytes())) == trace
    assert not (tmp_path / "profile" / "summary.txt").exists()  # rank 0's to write
    assert not (tmp_path / "profile" / "timeline.json").exists()
    record = write(RecordedProfiler(trace), tmp_path / "profile", (20, 21), 1.5, 0, 2)
    assert record["gpu_busy"] == 0.7 and record["gpu_kinds"] == {"matmul": 0.6, "other kernels": 0.1}
    timeline = json.loads((tmp_path / "profile" / "timeline.json").read_text())  # what the host's monitor draws
    assert timeline["busy"] == 0.7 and timeline["rows"]["stream 7 / matmul"] == [[0.0, 0.6]]
    summary = (tmp_path / "profile" / "summary.txt").read_text()
    assert summary.startswith("Steps 20-21 under torch.profiler on rank 0 of 2: 1.50 s")
    assert "GPU busy: 70.0% of the profiled time" in summary and "  matmul           60.0%" in summary
    assert "(operators by self_device_time_total, 25 rows)" in summary  # on a GPU: by kernel time


def test_a_trace_without_gpu_work_has_no_gpu_figures():
    assert gpu_time({"traceEvents": [op("aten::mm", 0.0, 10.0)]}) is None
    assert gpu_time({}) is None


@pytest.mark.parametrize("name, kind", [
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "matmul"), ("void gemv2T_kernel_val<int, int, float>", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop>", "matmul"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>", "other kernels"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>", "other kernels"),
    # Liger's Triton kernels (use_liger_kernel), by their functions' names; torch's own norm stays other work
    ("_rms_norm_forward_kernel", "Liger's kernels"), ("_swiglu_backward_kernel", "Liger's kernels"),
    ("liger_cross_entropy_kernel", "Liger's kernels"), ("element_mul_kernel", "Liger's kernels"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "other kernels"),
    # torch.compile's inductor: its fused Triton kernels, though their names list the operators fused
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "fused by torch.compile"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_view_3", "fused by torch.compile"),
    ("triton_per_fused__log_softmax_nll_loss_12", "fused by torch.compile"),
    ("triton_tem_fused_addmm_7", "matmul"), ("triton_tem_fused_flex_attention_0", "attention"),
])
def test_kernels_are_told_apart_by_the_names_their_libraries_give_them(name, kind):
    assert kernel_kind(name) == kind


def test_the_profile_is_written_through_no_link_planted_in_the_run_folder(tmp_path):
    """The run folder is every container's to write: a link planted at profile/ or at a file in it is never
    written through (runfolder.write); the folder planted as a link stops the profile, not the run (StepProfiler
    says so in train.log)."""
    trace = {"traceEvents": [op("aten::mm", 0.0, 10.0)]}
    elsewhere, target = tmp_path / "elsewhere", tmp_path / "bashrc"
    elsewhere.mkdir()
    target.write_text("the user's own\n")
    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "summary.txt").symlink_to(target)
    write(RecordedProfiler(trace), run / "profile", (3, 4), 0.1, 0, 1)
    assert target.read_text() == "the user's own\n" and not (run / "profile" / "summary.txt").is_symlink()
    other = tmp_path / "run2"
    other.mkdir()
    (other / "profile").symlink_to(elsewhere)
    with pytest.raises(DockyardError, match="link"):
        write(RecordedProfiler(trace), other / "profile", (3, 4), 0.1, 0, 1)
    assert list(elsewhere.iterdir()) == []
