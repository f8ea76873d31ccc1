#!/bin/sh
# On a GPU host without Docker (the trainer runs natively): install the wheels it lacks (benchmarks/gpu_kit.sh
# made .whl/ beside this checkout), then run one part, printing as it goes and keeping a copy of everything under
# $OUT (default gpu-out/), so that a call cut off by a time limit still leaves what it measured.
#
#   sh benchmarks/gpu_check.sh tests [PYTEST ARGS]  # tests/gpu (about 10 min on one H100; pass files to split it)
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
case "$part" in
tests)
	"$PY" -m pytest -q -p no:cacheprovider -rs --durations=15 "${@:-tests/gpu}" 2>&1 | tee "$OUT/tests-gpu.log" ;;
bench)
	"$PY" -m benchmarks.recipes --recipes "${1:-ddp,lora}" --steps 30 --try torch_compile=true --try use_liger_kernel=true \
		--out "$OUT/recipes.md" 2>&1 | tee "$OUT/recipes.log" ;;
compile)
	"$PY" -m benchmarks.compile 2>&1 | tee "$OUT/compile.log"
	cp benchmarks/results/compile.md "$OUT/" ;;
esac
