#!/bin/sh
# On a GPU host without Docker (the trainer runs natively): install the wheels it lacks (benchmarks/gpu_kit.sh
# made .whl/ beside this checkout), then run one part, printing as it goes and keeping a copy of everything under
# $OUT (default gpu-out/), so that a call cut off by a time limit still leaves what it measured. The exit status is
# the part's own (pytest's, the benchmark's), not the copy's.
#
#   sh benchmarks/gpu_check.sh tests [PYTEST ARGS]  # one slice of tests/gpu at a time, each under 10 min on one H100:
#        (no args)                    test_nvml + test_recipes_gpu (10 runs, ~7 min)
#        tests/gpu/test_autos_gpu.py  (17 runs, 5 of the 1B model, 4 compiled: ~10-12 min; add -k to split it)
#        tests/gpu/test_resume_gpu.py (16 runs: ~10 min; add -k to split it)
#      each test's name and outcome is printed as it ends; a test is stopped after 300 s
#   sh benchmarks/gpu_check.sh bench [RECIPES]      # benchmarks.recipes with no tuning flags, each recipe also
#                                                   # compiled (--try torch_compile=true) and with Liger's
#                                                   # kernels (--try use_liger_kernel=true); default ddp,lora
#   sh benchmarks/gpu_check.sh compile              # benchmarks.compile: whole model vs block by block
set -eu
case "${1:-}" in tests | bench | compile) ;; *)
	echo "usage: sh benchmarks/gpu_check.sh tests|bench|compile [...]" >&2
	exit 2 ;;
esac
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
"$PY" -c 'import deepspeed, bitsandbytes, peft, invoke' 2>/dev/null || sh benchmarks/gpu_kit.sh --install
rm -rf /tmp/tmp* 2>/dev/null || :  # run folders a killed run left: a 1B full fine-tune writes 15-18 GB
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
part=$1
shift
# dash has no pipefail: the part's status goes through a file, past the tee that copies what it prints
status="$OUT/.status"
case "$part" in
tests)
	paths=
	for a in "$@"; do case "$a" in tests/* | */*.py | *.py::*) paths=1 ;; esac; done
	[ -n "$paths" ] || set -- tests/gpu/test_nvml.py tests/gpu/test_recipes_gpu.py "$@"  # never the CPU tests
	cap=  # pytest-timeout: on the GPU hosts' image (KINDS.md), not a project dependency
	! "$PY" -c 'import pytest_timeout' 2>/dev/null || cap=--timeout=300
	{ rc=0; "$PY" -m pytest -v --tb=short -p no:cacheprovider -rs --durations=15 $cap "$@" || rc=$?
		echo $rc >"$status"; } 2>&1 \
		| tee "$OUT/tests-gpu.log" ;;
bench)
	{ rc=0; "$PY" -m benchmarks.recipes --recipes "${1:-ddp,lora}" --steps 30 --try torch_compile=true \
		--try use_liger_kernel=true --out "$OUT/recipes.md" || rc=$?; echo $rc >"$status"; } 2>&1 | tee "$OUT/recipes.log" ;;
compile)
	{ rc=0; "$PY" -m benchmarks.compile || rc=$?; echo $rc >"$status"; } 2>&1 | tee "$OUT/compile.log"
	# the committed table is the CPU's until this run rewrites it: copied only from a run that finished
	[ "$(cat "$status")" != 0 ] || cp benchmarks/results/compile.md "$OUT/" ;;
esac
exit "$(cat "$status")"
