#!/bin/sh
# Loads a dockyard image archive into this node's Docker engine with nothing but sh, coreutils, GNU tar,
# docker and zstd or gzip: copies the set once into a private folder (TMPDIR) and checks the sha256s there, checks
# that a thin archive's base layers are here, loads that copy, then checks that every image is present with
# the right id (docker load can exit 0 on failure) and that it loaded no name the manifest lacks. A refused
# load puts back every tag it moved.
# Written by `invoke save` beside the archives; it reads what it needs from <name>.manifest.json.
#
#   sh load.sh [ARCHIVE]       load ARCHIVE (default: the only archive in this folder)
#   sh load.sh --inventory     print this node's layer inventory (for `invoke save --thin-for=FILE`)
#   ALLOWED_SIGNERS=FILE sh load.sh ...   also require a good `ssh-keygen -Y` signature by a key in FILE
#   LOAD_SH_ANY_DRIVER=1 sh load.sh ...   load a CUDA image this node's NVIDIA driver or GPUs cannot run (refused
#                                         otherwise, before the copy: run.sh would refuse it; run.sh --cpu trains in it)
set -u
NAMESPACE=dockyard-archive

die() { printf '%s\n' "load.sh: $*" >&2; exit 1; }
# What a user gave, as a message quotes it (invoke's errors.short; run.sh has it too): its first 60 characters, else
# 57 and "..." (a value of thousands of characters was said whole); a path's first 120 ($2: as errors.cut says
# paths). In characters of UTF-8, cut between two: dash counts and cuts bytes (${#1}, printf %.Ns), which split an é
# in half. So bytes, in bash too (LC_ALL=C): a character is a byte other than 10xxxxxx, and the 10xxxxxx after it.
short() {
	(
		export LC_ALL=C
		n=${2:-60} tail=$(printf '[\200-\277]')
		chars=$(printf '%s' "$1" | tr -d '\200-\277')
		# past 4 bytes a character too: bytes that start none (10xxxxxx alone: Latin-1's ° ± µ, garbage) count none
		[ ${#chars} -gt "$n" ] || [ ${#1} -gt $((n * 4)) ] || { printf '%s' "$1"; exit 0; }
		cut=$(printf "%.$(((n - 3) * 4))s" "$1")  # the first n - 3 characters, whole, and some more
		chars=$(printf '%s' "$cut" | tr -d '\200-\277') left=${#chars}
		while [ "$left" -gt $((n - 3)) ]; do  # the last character off, a cut one first
			while case $cut in *$tail) ;; *) false ;; esac; do cut=${cut%?}; done
			cut=${cut%?} left=$((left - 1))
		done
		printf '%s...' "$cut"
	)
}
# "$1: still at it, N s so far ..." every LOAD_SH_EVERY seconds until killed (its sleep holds no output open); killed
# with SIGKILL: a SIGTERM sent before the subshell set its signals up (a step that ended at once) was lost, as it is
# where SIGTERM is ignored on entry, and the loop went on after the script ended
beat() {
	t=0 every=${LOAD_SH_EVERY:-30}
	case $every in ''|*[!0-9]*|0*) printf '%s\n' "load.sh: LOAD_SH_EVERY=$(short "$every") is not a whole number of seconds above 0: a line every 30 s" >&2; every=30 ;; esac
	while sleep "$every" </dev/null >/dev/null 2>&1; do
		t=$((t + every))
		printf '%s\n' "$1: still at it, $t s so far ..."
	done
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is missing on this node: $2"; }

# docker reaches its engine, or the script stops with docker's own last words and the usual fix (run.sh is written
# with this function too: runscript.py).
engine() {
	said=$(docker info 2>&1 >/dev/null) && return
	said=$(printf '%s\n' "$said" | grep -v -e '^errors pretty printing info' -e '^[[:space:]]*$' | tail -n 1)
	said=${said#ERROR: }
	case "$said" in
	*"permission denied"*) fix="add your user to the docker group: sudo usermod -aG docker $(id -un), then log in again; or use sudo" ;;
	*) fix="start dockerd, or set DOCKER_HOST to where it listens" ;;
	esac
	die "docker cannot reach an engine: ${said:-docker info failed, saying nothing} ($fix)"
}

# Whether this node's driver runs CUDA $1, as invoke run decides (dockyard/images/variants.py driver_runs): a CUDA X.y
# build runs on any driver of CUDA X or newer (minor-version compatibility) from the least for CUDA X on (CUDA_LEAST:
# "12=525.60.13 13=580"; 525.60.11 says CUDA 12.0 and is below 525.60.13); by that least alone where nvidia-smi gives
# no CUDA version. Exit 0: yes, 1: no, 2: cannot tell. After driver_facts. (run.sh is written with these three too.)
runs() {
	case $1 in '' | .* | *[!0-9.]*) return 2 ;; esac
	if [ -n "$HOST_CUDA" ]; then [ "${1%%.*}" -le "${HOST_CUDA%%.*}" ] || return 1; fi
	least=$(least_driver "$1")
	if [ -z "$least" ] || [ -z "$DRIVER" ]; then [ -z "$HOST_CUDA" ] && return 2; return 0; fi
	awk -v a="$DRIVER" -v b="$least" 'BEGIN { n = split(a, x, "."); m = split(b, y, "."); if (m > n) n = m
		for (i = 1; i <= n; i++) if (x[i] + 0 != y[i] + 0) exit (x[i] + 0 < y[i] + 0); exit 0 }'
}
least_driver() { for pair in $CUDA_LEAST; do [ "${pair%%=*}" != "${1%%.*}" ] || echo "${pair#*=}"; done; }
driver_facts() {  # DRIVER and HOST_CUDA from nvidia-smi's header ($SMI: "Driver Version: 535.183.01   CUDA Version: 12.2")
	DRIVER=$(printf '%s\n' "$SMI" | sed -n 's/.*Driver Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
	HOST_CUDA=$(printf '%s\n' "$SMI" | sed -n 's/.*CUDA Version: *\([0-9]\{1,3\}\.[0-9]\{1,3\}\).*/\1/p' | head -n 1)
}

# "GPU 0 (Tesla V100-SXM2-16GB, 7.0)" for each GPU of $CAPS (of $chosen, else all) without code in a build for $1
# ("7.5;8.6;12.0+PTX"): machine code of its major at or below its minor, or PTX at or below it. None for no archs.
no_code() {
	printf '%s\n' "$CAPS" | awk -F', *' -v archs="$1" -v chosen=",$chosen," '
	NF >= 3 && $3 ~ /^[0-9]+\.[0-9]+$/ && archs != "" && (chosen == ",," || index(chosen, "," $1 ",")) {
		split($3, h, "."); ok = 0; n = split(archs, a, /[; ]+/)
		for (i = 1; i <= n; i++) {
			e = a[i]; ptx = sub(/\+PTX$/, "", e)
			if (split(e, v, ".") < 2) continue
			at_or_below = v[1] + 0 < h[1] + 0 || (v[1] + 0 == h[1] + 0 && v[2] + 0 <= h[2] + 0)
			if (at_or_below && (ptx || v[1] + 0 == h[1] + 0)) ok = 1
		}
		if (!ok) { printf "%sGPU %s (%s, %s)", sep, $1, $2, $3; sep = ", " }
	}'
}

sha256() {  # of stdin; OpenSSL where it is there: several times faster than coreutils on large archives
	if command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r | cut -d' ' -f1
	else sha256sum | cut -d' ' -f1; fi
}

store() {  # containerd or classic
	case "$(docker info --format '{{range .DriverStatus}}{{index . 1}} {{end}}' 2>/dev/null)" in
	*containerd.snapshotter*) echo containerd ;;
	*) echo classic ;;
	esac
}

chain_ids() {  # every layer chain id this engine holds, one per line
	for id in $(docker image ls -aq --no-trunc | sort -u); do
		chain=
		for diff in $(docker image inspect --format '{{range .RootFS.Layers}}{{.}} {{end}}' "$id"); do
			if [ -z "$chain" ]; then chain=$diff
			else chain="sha256:$(printf '%s %s' "$chain" "$diff" | sha256sum | cut -d' ' -f1)"; fi
			echo "$chain"
		done
	done | sort -u
}

inventory() {
	need docker "install Docker"
	need sha256sum "install coreutils"
	engine
	printf '{"format": "dockyard-inventory/1", "host": "%s", "engine": {"store": "%s"}, "images": [],\n "chain_ids": [' \
		"$(hostname)" "$(store)"
	sep=
	for c in $(chain_ids); do printf '%s"%s"' "$sep" "$c"; sep=', '; done
	printf ']'
	# the node's driver and GPUs, as the load checks them (below), for `invoke save --thin-for` to check: none
	# without an nvidia-smi that answers. A GPU's name in printable ASCII, JSON's \ and " escaped
	if SMI=$(nvidia-smi 2>/dev/null); then
		driver_facts
		printf ',\n "driver": {"version": "%s", "cuda": "%s", "gpus": [' "$DRIVER" "$HOST_CUDA"
		nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader 2>/dev/null \
			| LC_ALL=C awk -F', *' 'NF >= 3 && $1 ~ /^[0-9]+$/ && $NF ~ /^[0-9]+\.[0-9]+$/ {
				name = $2; for (i = 3; i < NF; i++) name = name ", " $i
				gsub(/[^ -~]/, "", name); gsub(/\\/, "\\\\", name); gsub(/"/, "\\\"", name)
				printf "%s{\"name\": \"%s\", \"capability\": \"%s\"}", sep, name, $NF; sep = ", " }'
		printf ']}'
	fi
	printf '}\n'
}

[ "${1:-}" = --inventory ] && { inventory; exit 0; }
case "${1:-}" in
-h | --help) sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0"; exit 0 ;;
-*) die "unknown option $(short "$1"): sh load.sh [ARCHIVE] or sh load.sh --inventory (sh load.sh --help says more)" ;;
esac
[ $# -le 1 ] || die "one archive at a time: sh load.sh ARCHIVE"

field() {  # a value of the manifest's flat "load_sh" block (read only after the sha256 check); $2: another copy
	sed -n "s/^    \"$1\": \"\(.*\)\",\{0,1\}\$/\1/p" "${2:-$work/manifest.json}"
}

# Whether every image of the manifest is in the engine as saved ("loaded REF ID" for each); `quiet`: without
# saying which is not. The classic store names an image by its config digest, which the manifest holds; the
# containerd store by a manifest it writes while importing: there, compare the layers instead.
as_saved() {
	if [ "$(store)" = containerd ]; then
		checks=$LAYERS
		format='{{range $i, $l := .RootFS.Layers}}{{if $i}},{{end}}{{$l}}{{end}}'
	else
		checks=$IMAGES
		format='{{.Id}}'
	fi
	bad=0
	[ -n "$checks" ] || return 1  # a manifest naming nothing to check has checked nothing
	for pair in $checks; do
		ref=${pair%%=*}
		want=${pair#*=}
		got=$(docker image inspect --format "$format" "$ref" 2>/dev/null)
		if [ "$got" = "$want" ]; then
			printf '%s\n' "loaded $ref $(docker image inspect --format '{{.Id}}' "$ref")"
		else
			[ "${1:-}" = quiet ] || printf '%s\n' "load.sh: $ref is ${got:-missing}, expected $want" >&2
			bad=1
		fi
	done
	return "$bad"
}

# ALLOWED_SIGNERS is a file named from the caller's folder, as ARCHIVE is: made absolute before the cd below.
if [ -n "${ALLOWED_SIGNERS:-}" ]; then
	[ -f "$ALLOWED_SIGNERS" ] || die "ALLOWED_SIGNERS=$(short "$ALLOWED_SIGNERS" 120): no such file (an ssh allowed_signers file)"
	case "$ALLOWED_SIGNERS" in /*) ;; *) ALLOWED_SIGNERS="$(pwd)/$ALLOWED_SIGNERS" ;; esac
fi

# printable: a name of printable ASCII alone, said as it is (an escape sequence in a file name drives the terminal).
printable() { [ "$(printf '%s' "$1" | LC_ALL=C tr -d ' -~' | wc -c | tr -d ' ')" -eq 0 ]; }
# A file's name from inside an archive, as a line may say it: its bytes other than printable ASCII as '?' (a name is
# the archive maker's: an escape sequence in it reached the terminal), by its first 120 characters.
member() { short "$(printf '%s' "$1" | LC_ALL=C tr -c ' -~' '?')" 120; }
# ARCHIVE is found as given (from the caller's folder), or by a bare name beside load.sh; never a same-named
# file elsewhere. A folder (the one the set was carried in) is no archive: its archives, or its load.sh, are named.
if [ -n "${1:-}" ] && [ -d "$1" ]; then
	found=
	for f in "${1%/}"/*.tar.zst "${1%/}"/*.tar.gz "${1%/}"/*.tar; do
		[ -f "$f" ] && printable "$f" && found="${found:+$found, or }sh load.sh $f"
	done
	die "$(short "$1" 120) is a folder, not an archive: ${found:+name the archive in it, }${found:-it holds no archive (.tar.zst, .tar.gz or .tar)}"
fi
# An archive that is not there: the archive of its name beside it (another compression, or the name without its
# ending) is named, else how to bring it.
missing() {
	for g in "${1%.tar*}.tar.zst" "${1%.tar*}.tar.gz" "${1%.tar*}.tar"; do
		[ ! -f "$g" ] || die "$(short "$1" 120) is missing here: did you mean sh load.sh $(short "$g" 120)?"
	done
	die "$(short "$1" 120) is missing here: copy the archive with its .sha256 and .manifest.json"
}
if [ -n "${1:-}" ] && { [ -f "$1" ] || [ "$1" != "$(basename "$1")" ]; }; then
	[ -f "$1" ] || missing "$1"
	cd "$(dirname "$1")" || die "cannot enter the folder of $(short "$1" 120)"
else
	cd "$(dirname "$0")" || die "cannot enter the loader's folder"
fi
# A name found in this folder is said, or taken, only where it is printable ASCII (printable, above), as every name
# invoke save writes is: said as it is, a file name's escape sequence would drive the terminal. Others are skipped,
# and that is said.
skipped=0
said_skipped() {
	[ "$skipped" -eq 0 ] || echo "load.sh: skipped $skipped file(s) here whose name holds a control character or a byte outside ASCII, which no name invoke save writes holds (said as it is, an escape sequence would drive the terminal): rename them to load them" >&2
}
began=$(date +%s)
name=$(basename "${1:-}")
if [ -z "$name" ]; then
	manifests=0
	for f in *.manifest.json; do
		[ -f "$f" ] || continue
		if printable "$f"; then manifests=$((manifests + 1)) manifest=$f; else skipped=$((skipped + 1)); fi
	done
	if [ "$manifests" -ne 1 ]; then
		found=
		for f in *.tar.zst *.tar.gz *.tar; do
			[ -f "$f" ] || continue
			if printable "$f"; then found="${found:+$found, }$f"; else skipped=$((skipped + 1)); fi
		done
		said_skipped
		[ -n "$found" ] || die "no archive beside load.sh in $(short "$(pwd)" 120): copy it here with its .sha256 and .manifest.json, or name it: sh load.sh PATH/NAME.tar.zst"
		die "name the archive to load (sh load.sh NAME), one of: $found"
	fi
	said_skipped
	set -- "$manifest"
	name=$(sed -n 's/^  "archive": "\(.*\)",$/\1/p' "$1")
	case $name in *[![:print:]]*) die "$1 names as its archive a name holding a control character (said as it is, an escape sequence drives the terminal), which no save gives an archive: refused, nothing was loaded" ;; esac
	# read before any check: a name with a path (../../x) would have the copy below opened over that file, emptying it
	case $name in '' | */* | -*) die "$1 names the archive '$(short "$name" 120)', which is not a file name beside it: refused, nothing was loaded" ;; esac
fi
case "$name" in *.manifest.json | *.manifest.json.sig | *.sha256)
	stem=${name%.sig}
	stem=${stem%.manifest.json}
	die "$(short "$name" 120) is a companion of the archive, not the archive: give the archive itself (its .tar.zst, .tar.gz or .tar beside it), e.g. sh load.sh $(short "${stem%.sha256}.tar.zst" 120)" ;;
esac
base=${name%.tar*}
for f in "$name" "$base.sha256" "$base.manifest.json"; do
	[ -f "$f" ] || [ "$f" != "$name" ] || missing "$f"
	[ -f "$f" ] || die "$(short "$f" 120) is missing here: copy the archive with its .sha256 and .manifest.json"
done

need sha256sum "install coreutils"
need docker "install Docker"
tar --version 2>/dev/null | grep -q 'GNU tar' || die "GNU tar is missing on this node: install tar (apt-get install tar)"
case "$name" in
*.zst) need zstd "install zstd (apt-get install zstd), or ship a gzip archive (invoke save --compress=gzip)"
	unpack="zstd -dc" ;;
*.gz) need gzip "install gzip"; unpack="gzip -dc" ;;
*) unpack= ;;
esac

# A load.sh killed outright once docker load could move tags (its folder holds `before`, every tag as it was, written
# just before docker load) put none back and said nothing; `invoke load` keeps a journal for the same. Said by the next
# load.sh, once, as `invoke load` says it: a tag moved to the archive's image (from an image of the user's, now
# untagged or not), or a tag left on another image than the archive's (the check never ran), and how to put it back.
# `invoke load` reads the same folder (load.py load_sh_record: its name, `manifest.json`, `before`, `load.out`), says
# the same and removes it: keep the four as they are.
said_moved() {  # the folder of a killed load.sh, its process id
	[ -f "$1/before" ] && [ -f "$1/manifest.json" ] || return 0
	docker info >/dev/null 2>&1 || return 1  # kept for a load.sh that can ask the engine
	archive=$(sed -n 's/^  "archive": "\(.*\)",$/\1/p' "$1/manifest.json")
	for ref in $( (for pair in $(field check_images "$1/manifest.json"); do printf '%s\n' "${pair%%=*}"; done
		sed -n 's/^Loaded image: //p' "$1/load.out" 2>/dev/null) | sort -u); do
		now=$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null)
		was=$(awk -v r="$ref" '$2 == r { print $1; exit }' "$1/before")
		[ -n "$now" ] && [ "$now" != "$was" ] || continue
		short=$(printf '%s' "${was#sha256:}" | cut -c1-12)
		IMAGES=$(for pair in $(field check_images "$1/manifest.json"); do [ "${pair%%=*}" = "$ref" ] && printf '%s\n' "$pair"; done)
		LAYERS=$(for pair in $(field check_layers "$1/manifest.json"); do [ "${pair%%=*}" = "$ref" ] && printf '%s\n' "$pair"; done)
		if as_saved quiet >/dev/null; then
			[ -n "$was" ] || continue
			kept=$(docker image inspect --format '{{range .RepoTags}}{{.}} {{end}}' "$was" 2>/dev/null | sed 's/ *$//; s/ /, /g')
			printf '%s\n' "load.sh: replaced tag $ref (the image it named before, $short, ${kept:+still tagged }${kept:-is now untagged}): by a load of $archive killed outright (process $2) before it could say so"
		else
			printf '%s\n' "load.sh: warning: $ref names $(printf '%s' "${now#sha256:}" | cut -c1-12), not the image $archive holds: a load of it killed outright (process $2) before its check left it so; it named ${short:-nothing} before. Put it back: $(if [ -n "$was" ]; then printf '%s\n' "docker tag $short $ref"; else printf '%s\n' "docker rmi $ref"; fi)" >&2
		fi
	done
}

# Every file is read once, into a private folder, and checked and used there: a file changed in the shared
# folder after its check (another writer, an NFS scratch) is never what gets loaded.
# A load.sh killed outright (kill -9, the OOM killer, a power cut) runs no trap: its copy stayed in TMPDIR for good.
# This user's whose load.sh is gone (the pid in the name) are removed first, and said: only those made on this host (the
# tag of its name beside the pid, as invoke's locks.host_tag makes it), for a TMPDIR several nodes share (a scratch with
# room, loaded on every node at once) holds the folders of other nodes' live load.sh, whose pid says nothing here.
HOST_TAG=$(printf '%s' "$(uname -n)" | sha256 | cut -c1-8)
for old in "${TMPDIR:-/tmp}"/dockyard-load.*; do
	[ -d "$old" ] && [ -O "$old" ] && [ ! -h "$old" ] || continue
	pid=${old##*/dockyard-load.}
	tag=${pid#*.}  # "TAG.XXXXXX", or "XXXXXX" for a folder made before the tag
	pid=${pid%%.*}
	case $pid in '' | *[!0-9]*) continue ;; esac
	case $tag in *.*) [ "${tag%%.*}" = "$HOST_TAG" ] || continue ;; esac
	kill -0 "$pid" 2>/dev/null && continue
	said_moved "$old" "$pid" || continue
	rm -rf "$old" && printf '%s\n' "load.sh: removed $(short "$old" 120), the private copy of a load.sh killed before it could remove it" >&2
done
work=$(mktemp -d "${TMPDIR:-/tmp}/dockyard-load.$$.$HOST_TAG.XXXXXX") || die "cannot make a private folder in $(short "${TMPDIR:-/tmp}" 120)"
# The folder (a full-size copy of the archive) goes however the script ends. A signal ends it through `exit`,
# which runs the EXIT trap (dash runs none for a signal alone). The long steps run in the background and are
# waited for: a trapped signal stops `wait` at once, where it would wait for a command in the foreground to end.
# What they left running is stopped; a step stopped that way may still write its note into the folder as it
# ends (a decompressor cut off writes "bad"), racing the removal: a second removal a moment later gets that too.
running=
beater=
trap 'kill $running 2>/dev/null; kill -9 $beater 2>/dev/null; rm -rf "$work" 2>/dev/null || { sleep 1; rm -rf "$work"; }' EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
# Each read bounded, as `invoke load` reads them: a .sha256 is two lines, a manifest lists a few images (a file of
# gigabytes was copied whole into TMPDIR, then read by sed for every field). The digests (a line's first 64
# characters) in either case, as sha256sum -c takes them.
head -c 65537 "$base.sha256" >"$work/sums.read" && head -c 16777217 "$base.manifest.json" >"$work/manifest.json" \
	&& awk '{ print tolower(substr($0, 1, 64)) substr($0, 65) }' "$work/sums.read" >"$work/sums" \
	|| die "cannot copy $base.sha256 and $base.manifest.json into $(short "$work" 120)"
[ "$(wc -c <"$work/sums.read" | tr -d ' ')" -le 65536 ] \
	|| die "$base.sha256 is more than 64 KiB, more than any checksum file of a set holds (two lines): refused, nothing was loaded. Copy the set again"
[ "$(wc -c <"$work/manifest.json" | tr -d ' ')" -le 16777216 ] \
	|| die "$base.manifest.json is more than 16 MiB, more than any archive manifest holds: refused, nothing was loaded. Copy the set again"

if [ -n "${ALLOWED_SIGNERS:-}" ]; then
	need ssh-keygen "install openssh-client (needed to check signatures)"
	# a plain file of at most 64 KiB (an ssh signature is about 300 bytes): a link to /dev/zero filled TMPDIR, a pipe
	# waited for ever
	[ -e "$base.manifest.json.sig" ] || [ -L "$base.manifest.json.sig" ] \
		|| die "$name is not signed ($base.manifest.json.sig is missing) and ALLOWED_SIGNERS is set: refused, nothing was loaded"
	[ -f "$base.manifest.json.sig" ] \
		|| die "$base.manifest.json.sig is not a plain file (a pipe, a device, a link to nothing): give the signature \`invoke save --sign\` writes. Refused, nothing was loaded"
	head -c 65537 "$base.manifest.json.sig" >"$work/manifest.json.sig" \
		|| die "cannot copy $base.manifest.json.sig into $(short "$work" 120): refused, nothing was loaded"
	[ "$(wc -c <"$work/manifest.json.sig" | tr -d ' ')" -le 65536 ] \
		|| die "$base.manifest.json.sig is more than 64 KiB, more than any ssh signature holds: give the signature \`invoke save --sign\` writes. Refused, nothing was loaded"
	who=$(ssh-keygen -Y find-principals -s "$work/manifest.json.sig" -f "$ALLOWED_SIGNERS" 2>/dev/null | head -n 1)
	[ -n "$who" ] || die "$name was signed by a key not in $ALLOWED_SIGNERS: refused, nothing was loaded"
	ssh-keygen -Y verify -f "$ALLOWED_SIGNERS" -I "$who" -n "$NAMESPACE" -s "$work/manifest.json.sig" \
		<"$work/manifest.json" >/dev/null 2>&1 \
		|| die "the signature of $base.manifest.json does not verify: refused, nothing was loaded"
	signed=$(sed -n 's/.*"archive_sha256": "\([0-9a-f]*\)".*/\1/p' "$work/manifest.json")
	listed=$(grep "  $name\$" "$work/sums" | cut -d' ' -f1)
	[ -n "$signed" ] && [ "$signed" = "$listed" ] || die "$base.sha256 does not match the signed manifest: refused, nothing was loaded"
	printf '%s\n' "signature good: signed by $who"
fi

# Exactly the two lines `invoke save` writes: an empty, partial or padded .sha256 would verify less than it claims.
awk -v a="$name" -v m="$base.manifest.json" '
	NF == 2 && length($1) == 64 && $1 !~ /[^0-9a-f]/ && ($2 == a || $2 == m) && !seen[$2]++ { n++; next }
	{ bad = 1 }
	END { exit (bad || n != 2) }' "$work/sums" \
	|| die "$base.sha256 must list exactly $name and $base.manifest.json: refused, nothing was loaded"
listed() { awk -v f="$1" '$2 == f { print $1 }' "$work/sums"; }

got=$(sha256 <"$work/manifest.json")
[ "$got" = "$(listed "$base.manifest.json")" ] \
	|| die "$base.manifest.json is damaged, truncated or was changed (sha256 mismatch: $got): nothing was loaded. Copy it again."

[ "$(sed -n 's/^  "archive_sha256": "\([0-9a-f]*\)",$/\1/p' "$work/manifest.json")" = "$(listed "$name")" ] \
	|| die "$base.sha256 and $base.manifest.json disagree about $name: refused, nothing was loaded"
# `invoke save` writes the manifest in printable ASCII (JSON escapes anything else), and `invoke load` reads it as JSON,
# where no raw control character can be: one here (an escape sequence in a tag of a crafted set, with a .sha256 to
# match) reached the terminal as it was wherever a line below names a tag, and the next load.sh's said_moved too.
[ "$(LC_ALL=C tr -d '\n -~' <"$work/manifest.json" | wc -c | tr -d ' ')" -eq 0 ] \
	|| die "$base.manifest.json holds control characters or bytes outside ASCII, which no manifest invoke save writes holds (a tag's escape sequence would drive the terminal): refused, nothing was loaded"

IMAGES=$(field check_images)
LAYERS=$(field check_layers)
REQUIRES=$(field require_chains)
NEED_KB=$(field need_kb)
TAR_BYTES=$(sed -n 's/^  "tar_bytes": \([0-9]\{1,18\}\),$/\1/p' "$work/manifest.json")
ARCHIVE_BYTES=$(sed -n 's/^  "archive_bytes": \([0-9]\{1,18\}\),$/\1/p' "$work/manifest.json")
[ -n "$IMAGES" ] && [ -n "$TAR_BYTES" ] && [ -n "$ARCHIVE_BYTES" ] && printf '%s' "$NEED_KB" | grep -qx '[0-9]\{1,18\}' \
	|| die "$base.manifest.json is not a dockyard manifest (check_images, need_kb, tar_bytes, archive_bytes): refused, nothing was loaded"
# Each name is looked up in the engine, each base layer in its list: a save gives a few images a few names, an image
# has at most 127 layers (the limits of `invoke load`: MAX_NAMES, MAX_CHAINS in load.py).
MAX_NAMES=128
MAX_CHAINS=8192
[ "$(printf '%s' "$IMAGES" | wc -w)" -le "$MAX_NAMES" ] && [ "$(printf '%s' "$LAYERS" | wc -w)" -le "$MAX_NAMES" ] \
	|| die "$base.manifest.json names more than $MAX_NAMES images (tags, or ids of untagged images), more than any save gives them, each to be looked up in the engine: refused, nothing was loaded"
[ "$(printf '%s' "$REQUIRES" | wc -w)" -le "$MAX_CHAINS" ] \
	|| die "$base.manifest.json requires more than $MAX_CHAINS base layers, more than any thin archive does: refused, nothing was loaded"
for pair in $IMAGES; do
	case "$pair" in -*) die "$base.manifest.json names an image ${pair%%=*}, which is not a reference: refused" ;; esac
done

# The node's driver and GPUs against the image run.sh trains in (needs_cuda and needs_archs: its dockyard.cuda and
# dockyard.cuda_archs labels), before the copy and the load (minutes, and the disk of a CUDA image): run.sh refuses an
# image this driver cannot run, or whose torch has no code for these GPUs (a V100 given cu132), so the node is told
# now, with the variant that runs here. Only where nvidia-smi answers: a node without a driver (a build host, a CPU
# node: run.sh --cpu) loads any image, and run.sh says what is wrong with a driver that fails.
NEEDS_CUDA=$(field needs_cuda)
CUDA_LEAST=$(field cuda_least)
chosen=  # every GPU (no_code)
if [ -n "$NEEDS_CUDA" ] && [ -z "${LOAD_SH_ANY_DRIVER:-}" ] && SMI=$(nvidia-smi 2>/dev/null); then
	driver_facts
	CAPS=$(nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader 2>/dev/null) || CAPS=
	lacking=$(no_code "$(field needs_archs)")
	usable=  # the GPUs its torch has code for: where some have, run.sh trains on them (CUDA_VISIBLE_DEVICES)
	for chosen in $(printf '%s\n' "$CAPS" | awk -F', *' 'NF >= 3 && $1 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+\.[0-9]+$/ { print $1 }'); do
		[ -n "$(no_code "$(field needs_archs)")" ] || usable=$usable${usable:+,}$chosen
	done
	chosen=
	runs "$NEEDS_CUDA"
	driver_ok=$?
	instead=  # the variant this driver runs with code for every GPU here (invoke run's auto), newest first
	if [ "$driver_ok" -eq 1 ] || [ -n "$lacking" ]; then
		for triple in $(field cuda_variants); do  # name=cuda=archs
			rest=${triple#*=}
			[ -z "$(no_code "${rest#*=}")" ] && runs "${rest%%=*}" && { instead=${triple%%=*}; break; }
		done
	fi
	if [ "$driver_ok" -ne 1 ] && [ -n "$lacking" ] && [ -n "$usable" ]; then
		printf 'load.sh: note: %s holds a torch with no code for %s, which run.sh refuses to train on: give it the others, as in CUDA_VISIBLE_DEVICES=%s sh run.sh ...%s\n' \
			"$(field cuda_image)" "$lacking" "$usable" \
			"${instead:+; or carry the $instead archive (invoke save --variant=$instead), whose torch has code for every GPU here}" >&2
		lacking=
	fi
	if [ "$driver_ok" -eq 1 ] || [ -n "$lacking" ]; then
		least=$(least_driver "$NEEDS_CUDA")
		if [ "$driver_ok" -ne 1 ]; then
			why="holds a torch with no code for $lacking (it has $(field needs_archs)), on any driver"
			fix="No variant has code for them"
			[ -z "$instead" ] || fix="Carry the $instead archive instead (invoke save --variant=$instead): its torch has their code"
		else  # the driver, and where some GPUs lack its code, those too: an upgrade trains on the others
			why="needs CUDA $NEEDS_CUDA but this node's driver ${DRIVER:-(version unknown)}${HOST_CUDA:+ supports CUDA $HOST_CUDA}${lacking:+, and it holds a torch with no code for $lacking}"
			fix="Upgrade the driver${least:+ to $least or newer}"
			if [ -n "$lacking" ] && [ -z "$usable" ]; then
				fix="No variant has code for $lacking"
				[ -z "$instead" ] || fix="Carry the $instead archive instead (invoke save --variant=$instead): its torch has their code"
			else
				[ -z "$instead" ] || fix="Carry the $instead archive instead (invoke save --variant=$instead), or u${fix#U}"
			fi
		fi
		die "$(field cuda_image) $why, so run.sh would refuse it: nothing was copied or loaded. $fix; LOAD_SH_ANY_DRIVER=1 sh load.sh loads it anyway (for run.sh --cpu)"
	fi
fi

# Before the copy, which takes minutes for a large archive: an engine that cannot be reached is said at once.
engine
size=$(wc -c <"$name" | tr -d ' ')
[ "$size" = "$ARCHIVE_BYTES" ] \
	|| die "$name is $size bytes, the manifest says $ARCHIVE_BYTES: the copy is truncated or was changed. Copy it again (invoke ship continues a cut copy). Nothing was loaded."
# Every image already in this engine as saved (the same archive loaded before): nothing to copy, hash or load. By id
# alone (the digest of the image's config and layers), so on the classic store only: containerd names an image by a
# manifest it writes on import, and the same layers under another config are another image.
if [ "$(store)" = classic ] && as_saved quiet >"$work/said"; then
	printf '%s\n' "$name: every image it holds is already loaded here, as saved (same id; the archive itself was not read): nothing to do"
	sed 's/^loaded /already here: /' "$work/said"  # not "loaded": nothing was
	exit 0
fi
# The archive is copied once into the private folder, hashed on the way: what is loaded is that copy.
free=$(df -Pk "$work" | awk 'NR == 2 { print $4 }')
[ "$free" -ge $((ARCHIVE_BYTES / 1024 + 1024)) ] \
	|| die "not enough space in $(short "$work" 120) for a private copy of $name (${free} KiB free, $((ARCHIVE_BYTES / 1024)) KiB needed): set TMPDIR to a folder with room"
printf '%s\n' "verifying $name ($((ARCHIVE_BYTES / 1048576)) MiB: its sha256, on the way to a private copy that is what gets loaded) ..."
mkfifo "$work/copy" || die "cannot make a fifo in $(short "$work" 120)"
sha256 <"$work/copy" >"$work/copy.sha256" & hasher=$!
tee "$work/$name" >"$work/copy" <"$name" & copier=$!
running="$hasher $copier"
beat "verifying $name" & beater=$!
wait "$copier" || die "cannot copy $name into $(short "$work" 120) (full?): nothing was loaded"
wait "$hasher"
running=
kill -9 "$beater" 2>/dev/null
beater=
got=$(cat "$work/copy.sha256")
[ "$got" = "$(listed "$name")" ] \
	|| die "$name is damaged, truncated or was changed (sha256 mismatch: $got, expected $(listed "$name")): nothing was loaded. Copy it again."

if [ -n "$REQUIRES" ]; then
	[ "$(store)" = classic ] || die "this engine uses the containerd image store, which cannot load a thin archive: load the full archive"
	have=$(chain_ids)
	missing=0
	for c in $REQUIRES; do
		printf '%s\n' "$have" | grep -qx "$c" || missing=$((missing + 1))
	done
	[ "$missing" -eq 0 ] || die "this thin archive needs $missing base layers this node does not hold: load the full archive (invoke save without --thin-for). Nothing was loaded."
fi
root=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null)
if [ -d "$root" ]; then
	free=$(df -Pk "$root" | awk 'NR == 2 { print $4 }')
	[ "$free" -ge "$NEED_KB" ] || die "not enough space for docker load in $root: ${free} KiB free, about ${NEED_KB} KiB needed"
fi

# What every tag named before loading: a refused load puts back each tag it moved (roll_back).
docker image ls -a --no-trunc --format '{{.ID}} {{.Repository}}:{{.Tag}}' >"$work/before" \
	|| die "docker cannot list its images"
roll_back() {
	names=$(for pair in $IMAGES; do printf '%s\n' "${pair%%=*}"; done; sed -n 's/^Loaded image: //p' "$work/load.out" 2>/dev/null)
	moved=
	for ref in $(printf '%s\n' "$names" | sort -u); do
		now=$(docker image inspect --format '{{.Id}}' "$ref" 2>/dev/null)
		was=$(awk -v r="$ref" '$2 == r { print $1; exit }' "$work/before")
		[ "$now" = "$was" ] && continue
		if [ -n "$was" ]; then docker tag "$was" "$ref" >/dev/null 2>&1 && moved="$moved $ref"
		# a new name on an image that was here: untagged, unless that image had no name (rmi would remove it)
		elif ! grep -qx "$now <none>:<none>" "$work/before"; then docker rmi "$ref" >/dev/null 2>&1 && moved="$moved $ref"
		fi
		grep -q "^$now " "$work/before" || echo "$now" >>"$work/new"
	done
	sed -n 's/^Loaded image ID: //p' "$work/load.out" 2>/dev/null >>"$work/new"
	for id in $(sort -u "$work/new" 2>/dev/null); do
		grep -q "^$id " "$work/before" || docker rmi "$id" >/dev/null 2>&1
	done
	[ -z "$moved" ] || printf '%s\n' "load.sh: the tags the load moved are back where they were:$moved; the images it brought are removed" >&2
}
refuse() { cat "$work/load.out" >&2 2>/dev/null; roll_back; die "$@"; }

limit=$((TAR_BYTES + 1048576))  # the tar as written can pad a little past what docker save gave
# The private copy is read once before docker load sees any of it: a stream that fails only after its tar is whole
# (garbage after the last frame) would otherwise be loaded by the engine while this script refuses it. GNU tar reads
# the first bytes of every file in the tar on the way: docker load inflates a file that starts as gzip, bzip2, xz or
# zstd does by itself, past every size the manifest declares (a 600-byte archive filled 256 MB of disk), and docker
# save never writes one: such a tar is refused (`invoke load` refuses it the same way).
# A tar's files hold no more bytes than the tar itself, except sparse files: their holes take no room in the tar,
# and docker load writes them out in full (a 649-byte archive wrote 1 GiB). GNU tar gives each file's size as
# written out: the files of the tar, and of each layer's own tar, may not add up to more than that tar's bytes.
mkdir "$work/p" && : >"$work/p/sizes" || die "cannot make a folder in $(short "$work" 120)"
cat >"$work/p/peek.sh" <<'PEEK'
# one file of the tar on stdin (GNU tar --to-command): its first bytes and name, and, for a layer, its own tar's size
case $TAR_FILENAME in
*/layer.tar | blobs/sha256/*)
	f=$PEEK_DIR/fifo
	mkfifo "$f" || exit 1
	{ od -An -tx1 -N6 | tr -d ' \n'; cat >/dev/null; } <"$f" >"$f.start" &
	tee "$f" | { LC_ALL=C tar -tv --numeric-owner -f - 2>/dev/null | awk '{ n += $3 } END { printf "%.0f\n", n }' >"$f.n"
		cat >/dev/null; }
	wait
	printf '%s\n' "$(cat "$f.start") $TAR_FILENAME"
	[ "$(cat "$f.n")" -le "$TAR_SIZE" ] || printf '%s\n' "$TAR_FILENAME" >>"$PEEK_DIR/sparse"
	rm -f "$f" "$f.start" "$f.n" ;;
*) od -An -tx1 -N6 | tr -d ' \n'; printf '%s\n' " $TAR_FILENAME"; cat >/dev/null ;;
esac
echo "$TAR_SIZE" >>"$PEEK_DIR/sizes"
PEEK
printf '%s\n' "checking $name ..."
mkdir "$work/x" && mkfifo "$work/count" || die "cannot make a folder and a fifo in $(short "$work" 120)"
wc -c <"$work/count" >"$work/bytes" & running=$!
beat "checking $name" & beater=$!
{ ${unpack:-cat} "$work/$name" 2>"$work/unpack.err" || : >"$work/bad"; } | head -c $((limit + 1)) | tee "$work/count" \
	| { (cd "$work/x" && export PEEK_DIR="$work/p" && exec tar -x -f - --to-command='sh "$PEEK_DIR/peek.sh"') \
		>"$work/starts" 2>"$work/tar.err" || : >"$work/badtar"; cat >/dev/null; }
wait $running
running=
kill -9 "$beater" 2>/dev/null
beater=
[ "$(tr -d ' ' <"$work/bytes")" -le "$limit" ] \
	|| die "$name decompresses to more than its manifest declares ($TAR_BYTES bytes of tar): refused, nothing was loaded"
[ -e "$work/bad" ] && die "$name does not decompress ($(tail -n 1 "$work/unpack.err")): nothing was loaded"
[ -e "$work/badtar" ] && die "the tar of $name does not read as one ($(tail -n 1 "$work/tar.err")): refused, nothing was loaded"
packed=$(grep -E -m 1 '^(1f8b08|425a68|fd377a585a00|28b52ffd|5[0-9a-f]2a4d18)' "$work/starts")
[ -z "$packed" ] || die "the tar's $(member "${packed#* }") is compressed: docker load would inflate it past every size the manifest declares, and docker save never writes one: refused, nothing was loaded"
[ ! -e "$work/p/sparse" ] || die "the tar's $(member "$(head -n 1 "$work/p/sparse")") holds a sparse file: docker load would write its holes out in full, past every size the manifest declares: refused, nothing was loaded"
[ "$(awk '{ n += $1 } END { printf "%.0f", n }' "$work/p/sizes")" -le "$limit" ] \
	|| die "the tar of $name holds a sparse file: docker load would write its holes out in full, past every size the manifest declares: refused, nothing was loaded"

# docker load prints nothing until it is done (no progress without a terminal): how long to expect, said first,
# then a line every LOAD_SH_EVERY seconds (30) while it goes on: a log tells a slow load from a hung one
printf '%s\n' "loading $name: docker load unpacks $((TAR_BYTES / 1048576)) MiB of layers (about a minute for each few GB) and says nothing until it is done ..."
beat "loading $name" & beater=$!
# At most what the manifest declares reaches docker load (the free-space check counted that much): an archive
# that decompresses to more is stopped there, and docker load is killed before its input ends, so it loads
# nothing (`invoke load` does the same). Its input is a fifo this shell holds open until the count is known.
# When docker load itself stops reading (a full disk), head cannot write the limit: that is docker load's failure,
# said with its own exit code and message, not a tar longer than declared.
mkfifo "$work/tar" || die "cannot make a fifo in $(short "$work" 120)"
docker load <"$work/tar" >"$work/load.out" 2>&1 & loader=$!
running=$loader
exec 3>"$work/tar"
capped() {
	head -c "$limit" || { : >"$work/cut"; return; }
	[ "$(head -c 1 | wc -c)" -eq 0 ] || : >"$work/over"
}
{ ${unpack:-cat} "$work/$name" 2>"$work/unpack.err" || : >"$work/bad"; } | capped >&3 &
running="$loader $!"
wait $!
running=$loader
if [ -e "$work/cut" ]; then
	exec 3>&-
	wait "$loader"
	refuse "docker load stopped reading $name before its end (exit $?): refused"
fi
if [ -e "$work/over" ] || [ -e "$work/bad" ]; then
	kill "$loader" 2>/dev/null
	exec 3>&-
	wait "$loader"
	[ -e "$work/over" ] && refuse "$name decompresses to more than its manifest declares ($TAR_BYTES bytes of tar): stopped there, refused, nothing was loaded"
	refuse "$name does not decompress ($(tail -n 1 "$work/unpack.err")): nothing was loaded"
fi
exec 3>&-
wait "$loader" || refuse "docker load failed (exit $?): refused"
running=
kill -9 "$beater" 2>/dev/null
beater=
cat "$work/load.out"

# The tar holds only the images the manifest names: docker load says which names and ids it loaded.
for ref in $(sed -n 's/^Loaded image: //p' "$work/load.out"); do
	case " $IMAGES" in *" $ref="*) ;; *) refuse "the tar of $name holds an image named $ref, which its manifest does not name: refused" ;; esac
done
for id in $(sed -n 's/^Loaded image ID: //p' "$work/load.out"); do
	case "$IMAGES " in *"=$id "*) ;; *) refuse "the tar of $name holds an image $id its manifest does not name: refused" ;; esac
done

as_saved >"$work/said" || refuse "docker load did not load every image of $name: refused"
cat "$work/said"
printf '%s\n' "$name: verified and loaded in $(($(date +%s) - began)) s"  # as `invoke load` ends (ship reads "loaded " lines)
