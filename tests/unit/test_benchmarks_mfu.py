"""MFU as benchmarks/recipes.py reports it, against figures computed by hand."""

from benchmarks.mfu import flops_per_token, mfu, peak_flops


def test_flops_per_token_leaves_out_the_input_embedding_and_adds_attention():
    # 1,000,000 parameters of which a 100 x 50 input embedding (untied): 995,000 matmul weights.
    # 6 * 995,000 + 12 * 2 layers * 50 * 128 = 5,970,000 + 153,600
    full = flops_per_token(parameters=1_000_000, vocab=100, hidden=50, layers=2, seq_len=128, tied=False,
                           adapters=False)
    assert full == 6_123_600
    # adapters: no weight gradients for the frozen base, 4 * 995,000 + 153,600
    assert flops_per_token(parameters=1_000_000, vocab=100, hidden=50, layers=2, seq_len=128, tied=False,
                           adapters=True) == 4_133_600
    # tied: the shared matrix still multiplies as the output head, so all 1,000,000 count
    assert flops_per_token(parameters=1_000_000, vocab=100, hidden=50, layers=2, seq_len=128, tied=True,
                           adapters=False) == 6_153_600


def test_attention_counts_at_the_width_attention_runs_at():
    """A model whose heads × head_dim (512) is narrower than its hidden size (2048), as the 944M model issue 24
    measured: attention does 12 · layers · 512 · S, not 12 · layers · 2048 · S (which overstated its MFU by ~15 %)."""
    narrow = flops_per_token(parameters=1_000_000, vocab=100, hidden=2048, layers=2, seq_len=128, tied=True,
                             adapters=False, attention_width=512)
    assert narrow == 6 * 1_000_000 + 12 * 2 * 512 * 128


def test_the_benchmark_model_has_the_shape_of_a_real_1b_llama(tmp_path):
    """The GPU benchmark's model is the tiny model's config with ONE_B's sizes: TinyLlama-1.1B's shape, heads of 64
    (the tiny model's head_dim 16 once came along and made a 944M model whose attention ran at a quarter of its
    width), and the attention width MFU reads from the saved config is the one the model runs at."""
    from transformers import AutoConfig

    from benchmarks.recipes import ONE_B, TINY_MODEL
    from dockyard.common import memory
    from tests.support.measured import MEASURED_MODEL

    config = AutoConfig.from_pretrained(TINY_MODEL, **ONE_B)
    config.save_pretrained(tmp_path / "one-b")
    shape = memory.shape_from_folder(tmp_path / "one-b")
    assert shape.params == 1_100_048_384 and config.head_dim == 64
    assert shape.q_width == config.num_attention_heads * config.head_dim == config.hidden_size
    narrow = AutoConfig.from_pretrained(TINY_MODEL, **{k: v for k, v in MEASURED_MODEL.items() if k != "model_type"})
    narrow.save_pretrained(tmp_path / "measured")
    assert memory.shape_from_folder(tmp_path / "measured").q_width == 512


def test_peak_is_looked_up_by_the_exact_part():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H100 NVL", "bf16") == 835e12
    assert peak_flops("NVIDIA H200", "bf16") == 989e12
    assert peak_flops("NVIDIA H200 NVL", "bf16") == 835e12  # not the SXM part's figure
    assert peak_flops("NVIDIA A10", "bf16") == 125e12
    assert peak_flops("NVIDIA A10G", "bf16") is None  # not the A10's figure
    assert peak_flops("Tesla T4", "fp16") == 65e12 and peak_flops("Tesla T4", "bf16") is None
    assert peak_flops("NVIDIA B200", "bf16") == 2250e12
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    # parts as NVML names them, each its own data sheet's figure and not a neighbour's
    assert peak_flops("NVIDIA L4", "bf16") == 121e12 and peak_flops("NVIDIA L40", "bf16") == 181e12
    assert peak_flops("NVIDIA L40S", "bf16") == 362e12 and peak_flops("NVIDIA A40", "bf16") == 150e12
    assert peak_flops("NVIDIA GH200 480GB", "bf16") == 989e12 and peak_flops("NVIDIA H20", "bf16") == 148e12
    assert peak_flops("NVIDIA H800", "bf16") == 989e12 and peak_flops("NVIDIA H800 PCIe", "bf16") == 756e12
    assert peak_flops("Tesla V100-PCIE-32GB", "fp16") == 112e12 and peak_flops("Tesla V100-SXM2-16GB", "fp16") == 125e12
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16") is None
    # a MIG slice has a share of the part's compute: no MFU rather than one 7x too low
    assert peak_flops("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16") is None
    assert peak_flops("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16") is None


def test_mfu_is_achieved_over_peak_flops():
    # 10,000 tokens/s * 6e9 FLOPs per token = 6e13 FLOP/s on 2 GPUs of 1e14: 30 %
    assert mfu(10_000, 6e9, 1e14, 2) == 0.3
    assert mfu(10_000, 6e9, None, 2) is None


def test_attention_runs_over_each_examples_own_length():
    from benchmarks.mfu import attention_length

    assert attention_length([2048, 2048]) == 2048
    # a 100-token and a 900-token example: 900 of the 1000 tokens attend over 900 positions
    assert attention_length([100, 900]) == (100 * 100 + 900 * 900) / 1000
    assert attention_length([]) == 0.0


def test_the_trainer_and_the_benchmarks_share_one_formula():
    import benchmarks.mfu
    import dockyard.train.mfu

    assert benchmarks.mfu.flops_per_token is dockyard.train.mfu.flops_per_token
    assert benchmarks.mfu.peak_flops is dockyard.train.mfu.peak_flops
