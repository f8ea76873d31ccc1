#!/bin/sh
# The wheels a GPU host without Docker lacks to run tests/gpu and the benchmarks natively
# (README.md, "Tests"): downloaded here, on a
# connected machine, into .whl/ (git ignores it), pinned to the versions of images/locks/cu132.txt and
# pyproject.toml, for CPython 3.12 on x86_64. bitsandbytes is cut to its CUDA 13.0 and CPU libraries (43 MB -> ~4 MB)
# so that the whole kit travels under 64 MiB.
#
#   sh benchmarks/gpu_kit.sh            # writes .whl/
#   # on the GPU host, from the checkout:
#   sh benchmarks/gpu_kit.sh --install  # pip installs .whl/ into that python3, no network
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
KIT=.whl

if [ "${1:-}" = --install ]; then
	[ -d "$KIT" ] || { echo "gpu_kit: no $KIT/ here: run sh benchmarks/gpu_kit.sh on a connected machine first" >&2; exit 1; }
	"$PY" -m pip install -q --no-index --no-deps "$KIT"/*.whl
	work=$(mktemp -d)
	tar xzf "$KIT"/deepspeed-*.tar.gz -C "$work"
	(cd "$work"/deepspeed-* && DS_BUILD_OPS=0 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation .)
	rm -rf "$work"
	echo "gpu_kit: installed $(ls "$KIT" | wc -l) packages into $("$PY" -c 'import sys; print(sys.prefix)')"
	exit 0
fi

pin() {  # NAME -> NAME==VERSION from the cu132 lock, else from pyproject.toml
	v=$(grep -i "^$1==" images/locks/cu132.txt | head -1 | cut -d' ' -f1)
	[ -n "$v" ] || v=$(grep -io "\"$1==[^\"]*\"" pyproject.toml | head -1 | tr -d '"')
	[ -n "$v" ] || { echo "gpu_kit: no pin for $1" >&2; exit 1; }
	echo "$v"
}
# gathered beside the kit and put in its place at the end: a failed gather leaves the old kit whole
NEW="$KIT.new"
rm -rf "$NEW" && mkdir -p "$NEW"
req=
trap 'rc=$?; rm -f "$req"; [ $rc -eq 0 ] || { rm -rf "$NEW"; echo "error: gpu_kit: could not gather the kit (pip above says why; it needs PyPI or a mirror pip is set up for): $KIT/ is as it was" >&2; }' EXIT
wheels=""
for name in bitsandbytes datasets pydantic pydantic-core annotated-types typing-inspection invoke hjson dill \
	multiprocess transformers peft liger-kernel nvidia-ml-py xxhash einops msgpack ninja py-cpuinfo; do
	wheels="$wheels $(pin "$name")"
done
# shellcheck disable=SC2086 # one word per pin
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	--platform manylinux2014_x86_64 -d "$NEW" $wheels
# deepspeed is an sdist: downloaded by its locked hashes (what `invoke wheelhouse` does); pip reads its metadata
# (setup.py egg_info, with setuptools from the index) but installs nothing here.
req=$(mktemp)
awk '/^deepspeed==/ { on = 1 } on { print; if ($0 !~ /\\$/) exit }' images/locks/cu132.txt >"$req"
"$PY" -m pip download -q --no-deps --require-hashes -r "$req" -d "$NEW" --python-version 3.12 --implementation cp \
	--platform manylinux2014_x86_64

# bitsandbytes: keep the CUDA 13.0 and CPU libraries only, and a RECORD that says so.
"$PY" - "$NEW" <<'PYEOF'
import base64, csv, hashlib, io, pathlib, sys, zipfile
kit = pathlib.Path(sys.argv[1])
src = next(kit.glob("bitsandbytes-*.whl"))
keep = lambda n: not (n.endswith(".so") and "libbitsandbytes_" in n) or n.endswith(("_cuda130.so", "_cpu.so"))
tmp = src.with_suffix(".tmp")
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    rows = []
    for n in zin.namelist():
        if n == record or not keep(n):
            continue
        data = zin.read(n)
        zout.writestr(n, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([n, f"sha256={digest}", str(len(data))])
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([*rows, [record, "", ""]])
    zout.writestr(record, out.getvalue())
tmp.replace(src)
PYEOF
rm -rf "$KIT" && mv "$NEW" "$KIT"
du -sh "$KIT"
