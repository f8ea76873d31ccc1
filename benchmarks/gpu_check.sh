#!/bin/sh
# On a GPU host without Docker (the trainer runs natively): install the wheels it lacks (benchmarks/gpu_kit.sh
# made .whl/ beside this checkout), then run one part, printing as it goes and keeping a copy of everything under
# $OUT (default gpu-out/), so that a call cut off by a time limit still leaves what it measured. The exit status is
# the part's own (pytest's, the benchmark's), not the copy's. It stops first where torch sees no GPU: a part run on
# CPU would "pass" having checked nothing.
#
# Each part is sized for one call of under 10 minutes on one H100, after ~1 min of install on a fresh machine
# (a lease of 15 minutes holds one such call, perhaps two short ones: plan which one it is for):
#   sh benchmarks/gpu_check.sh tests [SLICE | PYTEST ARGS]   one slice of tests/gpu, never the CPU tests:
#        (nothing)    test_nvml + test_recipes_gpu (11 runs, ~7 min) + test_qlora_lean_gpu (seconds)
#        autos        test_autos_gpu.py on the tiny model, less the kernels' tests (9 runs, 4 of them compiled)
#        autos-kernels  the rest of it: Liger's kernels, padding-free, QLoRA compiled (5 runs, 1 compiled)
#        autos-944m   test_autos_gpu.py on the 944M model (6 runs, 2 models made, none saving a checkpoint: ~7 min)
#        resume       test_resume_gpu.py (a run and its resume per recipe, 16 runs: ~10 min, more than one call
#                     holds after the install), or in two calls: resume-a (ddp, fsdp, lora), resume-b (the rest)
#        all          every test of tests/gpu, in six pytest processes side by side (the slices above, resume in
#                     two), each with its own folder and log ($OUT/tests-gpu-SLICE.log); the
#                     tiny-model runs are bound by process start-up, not the GPU, so this takes about as long as the
#                     longest slice (one H200, 2026-11-27: the recipes slice, 5.3 min). Each slice is stopped after
#                     ${DEADLINE:-480} s, so a call of 10 minutes still brings back every log. The 944M runs share
#                     the GPU with the others on one of over 100 GB (an H200); on a smaller one they need it alone
#                     (their micro-batch leaves the plan's 10 % margin), so `all` leaves them out and says so: run
#                     `tests autos-944m` in a call of its own.
#        or pytest's own arguments naming tests under tests/gpu/ (-k alone: within the default slice; a named slice and
#        `all` refuse -k, which would replace their own: name the file, tests tests/gpu/test_autos_gpu.py -k X)
#      each test's name and outcome is printed as it ends; a test is stopped after 300 s (with pytest-timeout)
#   sh benchmarks/gpu_check.sh bench [RECIPES] [ARGS]   benchmarks.recipes with no tuning flags, each recipe also
#        compiled (--try torch_compile=true) and without Liger's kernels (--try use_liger_kernel=false: the autos turn
#        them on wherever they load, so that row is what they gain); default
#        ddp,lora (6 runs of the 1.1B benchmark model, ~6 min); steps 27-28 of every run profiled (profile_steps, left
#        out of tokens/s): where the GPU's time went, by kind of kernel, in $OUT/recipes-profiles.txt; ARGS go to
#        benchmarks.recipes (--steps 40, --bare, --profile 30-31, ...; with --steps under 28, a --profile within them);
#        PLAIN=1 runs each recipe once, with no tuning flags (issue 24's targets: PLAIN=1 ... bench
#        ddp,fsdp,zero2,lora,qlora, ~5 min)
#   sh benchmarks/gpu_check.sh compile [ARGS]           benchmarks.compile: whole model vs block by block
set -eu
case "${1:-}" in tests | bench | compile) ;; *)
	echo "usage: sh benchmarks/gpu_check.sh tests|bench|compile [...]" >&2
	exit 2 ;;
esac
if [ "$1" = tests ] && [ "${2:-}" = all ]; then  # checked before anything is installed or run
	case "${DEADLINE:-480}" in *[!0-9]* | 0*)
		echo "error: DEADLINE=$DEADLINE: give the seconds each slice may run, e.g. DEADLINE=450" >&2
		exit 2 ;;
	esac
fi
if [ "$1" = tests ]; then
	case "${2:-}" in all | autos | autos-kernels | autos-944m | resume-a | resume-b)
		# pytest keeps the last -k it is given: one here would replace the slice's own and run tests of others
		for a in "$@"; do
			case "$a" in -k*)
				echo "error: -k after 'tests $2' would replace the slice's own choice of tests: name the file instead," \
					"e.g. sh benchmarks/gpu_check.sh tests tests/gpu/test_autos_gpu.py -k '...'" >&2
				exit 2 ;;
			esac
		done ;;
	esac
fi
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
"$PY" -c 'import deepspeed, bitsandbytes, peft, invoke' 2>/dev/null || sh benchmarks/gpu_kit.sh --install
if ! smi=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1); then
	echo "error: nvidia-smi fails here (${smi:-not installed}): this is for a GPU host" >&2
	exit 1
fi
printf '%s\n' "$smi" | tee "$OUT/gpus.txt"
# Liger's kernels are Triton: a liger-kernel that cannot load with this host's triton would turn the Liger rows and
# test into errors of the host, not of the product; said here once (the Liger test then skips, saying so, and the
# bench leaves its Liger row out). Asked as the trainer asks (its monkey_patch module too, which the package loads
# only when first used).
liger=1
if ! said=$("$PY" -c 'import sys
from dockyard.train.environment import liger_kinds
kinds, why = liger_kinds()
sys.exit(why or (None if "llama" in kinds else "liger-kernel is not installed"))' 2>&1); then
	liger=
	echo "note: liger-kernel does not load here ($(printf '%s\n' "$said" | tail -1)): nothing of Liger's is checked"
fi
"$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
	|| { echo "error: torch sees no GPU (torch.cuda.is_available() is false): nothing would be checked" >&2; exit 1; }
# What an earlier call left, once this is known to be the GPU host: a killed 1B run's folder holds 15-18 GB.
# (The tests' own folders go with pytest's --basetemp below, which it empties as it starts.)
rm -rf /tmp/dockyard-bench-* 2>/dev/null || :
part=$1
shift
# dash has no pipefail: the part's status goes through a file, past the tee that copies what it prints
status="$OUT/.status"
# test_autos_gpu.py's tiny-model tests in two slices of under 10 minutes each: Liger's kernels, padding-free and
# QLoRA compiled (4-bit layers under torch.compile) in one, the rest in the other; the 944M model's in a third
KERNELS="liger or padding or (compile and qlora)"
AUTOS="not (944m or $KERNELS)"
RESUME_A="ddp or fsdp or lora"  # test_resume_gpu.py in two halves of 8 runs
case "$part" in
tests)
	cap=  # pytest-timeout: on the GPU hosts' image (KINDS.md), not a project dependency
	! "$PY" -c 'import pytest_timeout' 2>/dev/null || cap=--timeout=300
	if [ "${1:-}" = all ]; then
		shift
		run_slice() {  # NAME PYTEST-ARGS...: one pytest process, its own temporary folder and log
			name=$1
			shift
			rc=0
			timeout "${DEADLINE:-480}" "$PY" -m pytest -v --tb=short -p no:cacheprovider -rs --durations=10 \
				--basetemp="/tmp/dockyard-gpu-tests-$name" $cap "$@" >"$OUT/tests-gpu-$name.log" 2>&1 || rc=$?
			echo "$name $rc" >>"$OUT/slices.txt"  # one file for the six: a device call brings back 8 files at most
			echo "== $name: exit $rc ($(tail -1 "$OUT/tests-gpu-$name.log"))"
		}
		rm -f "$OUT/slices.txt"
		run_slice recipes tests/gpu/test_nvml.py tests/gpu/test_recipes_gpu.py tests/gpu/test_qlora_lean_gpu.py "$@" &
		# QLoRA compiled (4-bit layers under torch.compile) with the kernels: the autos slice held 10 runs, 5 compiled
		run_slice autos tests/gpu/test_autos_gpu.py -k "$AUTOS" "$@" &
		run_slice autos-kernels tests/gpu/test_autos_gpu.py -k "$KERNELS" "$@" &
		# the GPU's MiB, as nvidia-smi says them ("81559 MiB"): under 100 GB the 944M runs need the GPU to themselves
		mib=$(printf '%s\n' "$smi" | awk -F', ' '{print $3+0}' | sort -n | head -1)  # the smallest GPU's
		if [ "${mib:-0}" -gt 100000 ]; then
			run_slice autos-944m tests/gpu/test_autos_gpu.py -k 944m "$@" &
		else
			echo "note: the 944M tests are left out: on a GPU of ${mib:-?} MiB they need it alone (their auto micro-batch" \
				"leaves the plan's 10 % margin); run: sh benchmarks/gpu_check.sh tests autos-944m"
		fi
		run_slice resume-a tests/gpu/test_resume_gpu.py -k "$RESUME_A" "$@" &
		run_slice resume-b tests/gpu/test_resume_gpu.py -k "not ($RESUME_A)" "$@" &
		wait
		# a slice stopped at its deadline: torchrun ends its workers on timeout's TERM; any it left would hold the GPU
		pkill -f -- "--run-dir /tmp/dockyard-gpu-tests-" 2>/dev/null || :  # the tests' trainers alone
		# every test's outcome, slice by slice, then the worst exit status of the six
		grep -h "::" "$OUT"/tests-gpu-*.log | grep -E "(PASSED|FAILED|ERROR|SKIPPED|XFAIL)( |$)" | sed 's/ *\[ *[0-9]*%\]//' || :
		worst=0
		while read -r _ rc; do [ "$rc" = 0 ] || worst=$rc; done <"$OUT/slices.txt"
		exit "$worst"
	fi
	case "${1:-}" in
	autos) shift; set -- tests/gpu/test_autos_gpu.py -k "$AUTOS" "$@" ;;
	autos-kernels) shift; set -- tests/gpu/test_autos_gpu.py -k "$KERNELS" "$@" ;;
	autos-944m) shift; set -- tests/gpu/test_autos_gpu.py -k 944m "$@" ;;
	resume) shift; set -- tests/gpu/test_resume_gpu.py "$@" ;;
	resume-a) shift; set -- tests/gpu/test_resume_gpu.py -k "$RESUME_A" "$@" ;;
	resume-b) shift; set -- tests/gpu/test_resume_gpu.py -k "not ($RESUME_A)" "$@" ;;
	esac
	# the tests named: words under tests/gpu/ that are not an option's value (--deselect X, --ignore=X, -k X ...);
	# any other test path is refused, so that pytest never falls back to its testpaths, the CPU and Docker suite
	paths= prev=
	for a in "$@"; do
		case "$prev" in --deselect | --ignore | --ignore-glob | -k | -m | -p | -o | --rootdir | -c) prev=; continue ;; esac
		prev=$a
		case "$a" in
		-*) ;;
		tests/gpu | tests/gpu/* | ./tests/gpu | ./tests/gpu/*) paths=1 ;;
		*/* | *.py | *.py::*) echo "error: $a is not under tests/gpu/: this runs the GPU tests only" >&2; exit 2 ;;
		esac
	done
	[ -n "$paths" ] || set -- tests/gpu/test_nvml.py tests/gpu/test_recipes_gpu.py tests/gpu/test_qlora_lean_gpu.py "$@"
	{ rc=0; "$PY" -m pytest -v --tb=short -p no:cacheprovider -rs --durations=15 --basetemp=/tmp/dockyard-gpu-tests \
		$cap "$@" || rc=$?; echo $rc >"$status"; } 2>&1 | tee "$OUT/tests-gpu.log" ;;
bench)
	recipes=ddp,lora
	case "${1:-}" in '' | -*) ;; *) recipes=$1; shift ;; esac
	tries="--try torch_compile=true${liger:+ --try use_liger_kernel=false}"
	[ -z "${PLAIN:-}" ] || tries=  # PLAIN=1: one run per recipe, no tuning flags (issue 24's targets)
	# shellcheck disable=SC2086 # $tries: words, or none
	{ rc=0; "$PY" -m benchmarks.recipes --recipes "$recipes" --steps 30 $tries --profile 27-28 \
		--out "$OUT/recipes.md" "$@" || rc=$?; echo $rc >"$status"; } 2>&1 | tee "$OUT/recipes.log" ;;
compile)
	{ rc=0; "$PY" -m benchmarks.compile "$@" || rc=$?; echo $rc >"$status"; } 2>&1 | tee "$OUT/compile.log"
	# the committed table is the CPU's until this run rewrites it: copied only from a run that finished
	[ "$(cat "$status")" != 0 ] || cp benchmarks/results/compile.md "$OUT/" ;;
esac
exit "$(cat "$status")"
