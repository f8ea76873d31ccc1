#!/bin/sh
# Trains a dockyard recipe in a loaded image with nothing but sh and Docker: no Python, no checkout.
# Written by `invoke save` beside load.sh, from the same plan as `invoke run` (docker flags, mounts, torchrun line).
#
#   sh load.sh && sh run.sh --recipe=ddp --data=/data/x.jsonl --model=/models/m -- --max_steps 100
#
#   --recipe=NAME|FOLDER   a recipe in the image (default @DEFAULT_RECIPE@), or a folder holding a recipe.yaml
#   --data=PATH --model=PATH   your data file/folder and model folder, mounted read-only
#   --run-id=ID --runs=DIR     the run folder DIR/ID (default ./runs/<recipe>-<time>)
#   --resume                   continue run --run-id from its last complete checkpoint, with its own recipe and
#                              settings (give its --data and --model again: they are mounted as named)
#   --nproc=N --cpu            processes (default: one per GPU, else 2); --cpu: no GPU even in a CUDA image
#                              (CUDA_VISIBLE_DEVICES=0,2, indices or UUIDs: those GPUs only, as for invoke run)
#   --image=REF                the image (default: the one image of the archives beside run.sh, their
#                              *.manifest.json, that is loaded here; @IMAGE_DEFAULT@ where no manifest is beside it)
#   --disable-require          run an image newer than the driver's CUDA (CUDA forward compatibility, or an
#                              nvidia/cuda base's NVIDIA_REQUIRE_CUDA refusing the node's driver), as for invoke run
#   --dry                      print the docker command and train nothing (it asks the engine its limits, and
#                              makes the runs, Hugging Face cache and compile cache folders it would mount)
# Everything after -- overrides the recipe's settings (recipes/defaults.yaml in the image).
set -u
die() { printf '%s\n' "run.sh: $*" >&2; exit 1; }
# One word, quoted for eval (the '.' keeps the trailing newlines that $(...) would strip).
q() { qv=$(printf '%s.' "$1" | sed "s/'/'\\\\''/g"); printf "'%s'" "${qv%.}"; }
cmd=
add() { for a do cmd="$cmd $(q "$a")"; done; }
json() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
# HERE=the path, a relative one as ./PATH: a file named -v is then a file for cd, mkdir, dirname and basename,
# never an option (a variable, not $(...), which would strip trailing newlines).
# A leading ~ is the home folder, as invoke run reads it (the shell leaves --runs=~/x as typed).
here() {  # what path
	case $2 in
	'~' | '~/'*) [ -n "${HOME:-}" ] || die "$1=$(short "$2" 120): HOME is not set: give the full path"; HERE=$HOME${2#'~'} ;;
	'~'*) die "$1=$(short "$2" 120): run.sh reads ~ as your home folder only: give the full path" ;;
	/*) HERE=$2 ;;
	*) HERE=./$2 ;;
	esac
}
# A host path for docker's -v and the run's JSON record: a control character (a newline) would end the record,
# and -v splits on ':'.
mountable() {  # what path
	case $2 in *[[:cntrl:]]*) die "$1: the path holds a control character (a newline?): rename it" ;; esac
	case $2 in *:*) die "$1=$(short "$2" 120): docker -v cannot mount a path holding ':': rename it" ;; esac
}
# load.sh's engine() and its driver and GPU checks (runs, least_driver, driver_facts, no_code), copied in when run.sh is written, with
# the least driver of each CUDA major that load.sh reads from the manifest:
CUDA_LEAST=@MIN_DRIVER@
@LOADER_FUNCTIONS@
smi() {  # SMI=what `nvidia-smi ARGS` says, or the run stops with its first line
	SMI=$(nvidia-smi "$@" 2>&1) && return
	rc=$?
	said=$(printf '%s\n' "$SMI" | grep -v '^[[:space:]]*$' | head -n 1)
	case $said in *"No devices were found"*)
		die "nvidia-smi finds no GPU on this node ($said): --cpu to train on CPU, or run where the GPUs are" ;;
	esac
	die "nvidia-smi fails here (${said:-exit $rc}): the NVIDIA driver is installed but does not work; after a driver upgrade, reboot (or --cpu to train on CPU)"
}
# The image's CUDA (its dockyard.cuda label) against the driver's, from nvidia-smi's header ("Driver Version: 535.183.01
# CUDA Version: 12.2"): inside, torch would find no usable GPU. Names the image to load instead, newest first.
cuda_of() { docker image inspect --format '{{index .Config.Labels "dockyard.cuda"}}' "$1" 2>/dev/null; }
check_driver() {  # after driver_facts
	IMAGE_CUDA=$(cuda_of "$IMAGE")
	runs "$IMAGE_CUDA"
	fits=$?
	FITS=$fits  # for check_require, once the GPUs the run is given are known
	[ -z "$DISABLE_REQUIRE" ] || return 0
	[ $fits -eq 1 ] || return 0
	instead=
	for pair in @CUDA_VARIANTS@; do runs "${pair#*=}" && { instead=${pair%%=*}; break; }; done
	least=$(least_driver "$IMAGE_CUDA")
	# an image of that variant loaded here already (tagged): named, not "load it"
	loaded=$([ -z "$instead" ] || docker image ls --filter "label=dockyard.variant=$instead" --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep -v '<none>' | head -n 1)
	fix=${instead:+load the $instead image (invoke save --variant=$instead, then sh load.sh NAME here) or }
	[ -z "$loaded" ] || fix="$loaded is loaded here and runs on this driver: --image=$loaded; or "
	die "image $VARIANT needs CUDA $IMAGE_CUDA but driver ${DRIVER:-(version unknown)}${HOST_CUDA:+ supports CUDA $HOST_CUDA}: ${fix}upgrade the driver${least:+ to $least or newer} (or --cpu to train on CPU)"
}
# The GPUs the run is given ($chosen, else all) that the image's torch has no code for (its dockyard.cuda_archs label
# against nvidia-smi's compute_cap, as invoke run reads them: common/archs.py): inside, torch stops at its first
# kernel whatever the driver, a V100 (7.0) in the cu132 image. Names the image of a variant that has their code and
# that this driver runs.
check_archs() {
	archs=$(docker image inspect --format '{{index .Config.Labels "@ARCHS_LABEL@"}}' "$IMAGE" 2>/dev/null)
	CAPS=$(nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader 2>/dev/null) || return 0
	lacking=$(no_code "$archs")
	[ -n "$lacking" ] || return 0
	instead=
	for triple in @VARIANT_ARCHS@; do
		rest=${triple#*=}
		[ -z "$(no_code "${rest#*=}")" ] && runs "${rest%%=*}" && { instead=${triple%%=*}; break; }
	done
	die "image $(short "$IMAGE")'s torch has no code for $lacking (it holds $archs), on any driver: ${instead:+load the $instead image (invoke save --variant=$instead, then sh load.sh NAME here), or }leave those GPUs out with CUDA_VISIBLE_DEVICES (or --cpu to train on CPU)"
}
# The image's NVIDIA_REQUIRE_CUDA (an nvidia/cuda base's: a --devel build; the Debian-based builds set none), which the
# NVIDIA toolkit holds against the driver, and the brand of each GPU given to the container, as the container starts:
# docker's refusal, said before anything starts with the way out, as invoke run says it (dockyard/images/variants.py
# require_unmet).
check_require() {  # FITS: runs' exit for the image's CUDA (0: this driver runs it)
	require=$(docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" 2>/dev/null \
		| sed -n 's/^NVIDIA_REQUIRE_CUDA=//p' | head -n 1)
	[ -n "$require" ] || return 0
	case $require in *brand*) gpus=$(brands) ;; *) gpus= ;; esac  # nvidia-smi -q takes a while: only where it counts
	refused=$(require_refuses "$require" "$gpus")
	[ -n "$refused" ] || return 0
	major=${IMAGE_CUDA%%.*}
	why=
	[ "$FITS" -ne 0 ] || why=" (a CUDA $major driver runs any CUDA $major build)"
	branded=
	case $refused in *"	"*) branded="; it admits this driver on other brands of GPU only, not on this node's GPUs of${refused#*	}" ;; esac
	die "image $(short "$IMAGE") sets NVIDIA_REQUIRE_CUDA ${refused%%	*} (from its base image), and driver ${DRIVER:-(version unknown)}${HOST_CUDA:+ supports CUDA $HOST_CUDA}$branded: the NVIDIA toolkit would refuse to start it. --disable-require starts it$why, or load the $VARIANT image built without --devel (invoke build --variant=$VARIANT, then invoke save)"
}
# The brand of each GPU the run is given ($chosen, else all), from nvidia-smi -q's "Product Brand" (--query-gpu has no
# field for it), in brand='s words: "GeForce" is geforce, "NVIDIA RTX" nvidiartx (gpus.NVML_BRANDS); "?" where it says
# none (N/A). Nothing where nvidia-smi -q says nothing: every brand= may hold then.
brands() {
	for id in $(printf '%s' "${chosen:-all}" | tr ',' ' '); do
		if [ "$id" = all ]; then nvidia-smi -q 2>/dev/null; else nvidia-smi -q -i "$id" 2>/dev/null; fi
	done | sed -n 's/^[[:space:]]*Product Brand[[:space:]]*:[[:space:]]*//p' \
		| tr 'A-Z' 'a-z' | tr -d ' \r' | sed 's/^.*[^a-z0-9].*$/?/; s/^$/?/' | sort -u | tr '\n' ' '
}
# The condition of an NVIDIA_REQUIRE_CUDA by which the toolkit refuses this driver (DRIVER, HOST_CUDA) on a GPU of one
# of the brands $2 names, or nothing where it admits it or may on each, read as invoke run reads it
# (variants.require_refuses): alternatives apart by blanks, each of comma-separated conditions that must all hold; one
# on what nvidia-smi does not say (arch=, an unread brand or version) may hold. A brand= holds where it names the
# brand or, for one the toolkit does not call by name, unknown (variants.TOOLKIT_NAMED_BRANDS). Versions compare
# number by number, a shorter one first where it is the other's start (12.8 < 12.8.0), as Python compares
# variants.cuda_version's tuples. Where the brands alone are refused, a tab and " brand=B" for each follow.
require_refuses() {  # NVIDIA_REQUIRE_CUDA brands
	REQUIRE=$1 awk -v driver="$DRIVER" -v cuda="$HOST_CUDA" -v brands="$2" '
	function cmp(a, b,   x, y, n, m, i) {
		n = split(a, x, "."); m = split(b, y, ".")
		for (i = 1; i <= n && i <= m; i++) if (x[i] + 0 != y[i] + 0) return x[i] + 0 < y[i] + 0 ? -1 : 1
		return n < m ? -1 : n > m ? 1 : 0
	}
	function holds(cond, brand,   key, rest, op, v, have, c) {  # 1, 0, or -1: cannot tell
		if (cond ~ /^brand!?=[A-Za-z0-9_]+$/ && brand != "" && brand != "?") {
			v = tolower(substr(cond, index(cond, "=") + 1))
			c = v == brand || (v == "unknown" && brand !~ /^(quadro|tesla|nvs|grid|geforce|titan)$/)
			return cond ~ /^brand!=/ ? !c : c
		}
		if (cond ~ /^cuda/) { key = "cuda"; rest = substr(cond, 5); have = cuda }
		else if (cond ~ /^driver/) { key = "driver"; rest = substr(cond, 7); have = driver }
		else return -1
		if (rest ~ /^(>=|<=|==|!=)/) { op = substr(rest, 1, 2); v = substr(rest, 3) }
		else if (rest ~ /^[=<>]/) { op = substr(rest, 1, 1); v = substr(rest, 2) }
		else return -1
		# numbers of 9 digits at most, as invoke run reads them (no interval expression: mawk has none)
		if (v !~ /^[0-9]+(\.[0-9]+)*$/ || v ~ /[0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]/ \
			|| have !~ /^[0-9]+(\.[0-9]+)*$/) return -1
		c = cmp(have, v)
		return op == ">=" ? c >= 0 : op == "<=" ? c <= 0 : op == "==" || op == "=" ? c == 0 : op == "!=" ? c != 0 \
			: op == "<" ? c < 0 : c > 0
	}
	function admits(brand,   i, j, k, all, conds, seen) {  # 1 where one alternative holds, or may, on a GPU of brand
		for (i = 1; i <= n; i++) {
			if (alts[i] == "") continue
			seen = 1; all = 1; k = split(alts[i], conds, ",")
			for (j = 1; j <= k; j++) if (holds(conds[j], brand) == 0) { all = 0; break }
			if (all) return 1
		}
		return !seen
	}
	BEGIN {
		n = split(ENVIRON["REQUIRE"], alts, /[ \t\n\r\f\v]+/)
		m = split(brands, b, " ")
		for (i = 1; i <= m; i++) if (!admits(b[i])) refused = refused " brand=" b[i]
		if (refused == "" && (m > 0 || admits(""))) exit  # admitted on every GPU, or may be
		for (i = 1; i <= n; i++) {
			if (alts[i] == "") continue
			if (first == "") first = alts[i]
			if (said == "" && alts[i] ~ /^cuda/) said = alts[i]
		}
		said = said == "" ? first : said
		gsub(/[^ -~]/, "?", said)  # the image says it: no escape sequence of its reaches the terminal
		printf "%s%s", said, admits("") ? "\t" refused : ""
	}'
}
# CUDA_VISIBLE_DEVICES as invoke run reads it (dockyard/gpus.py select): GPU indices or UUIDs (or a UUID's unique start,
# GPU-5d5b), comma-separated, each a GPU of nvidia-smi -L's list ($SMI), read as CUDA reads them: up to the first entry
# that names no device (an empty one, as in 0,,1; -1; a word), after which CUDA sees none (set but empty, it sees
# none at all); docker gets their indices (--gpus '"device=0,2"'), torchrun one process each. A MIG device is
# refused: runs take whole GPUs.
visible() {
	chosen=
	[ -n "${CUDA_VISIBLE_DEVICES+set}" ] || return 0
	cvd=$CUDA_VISIBLE_DEVICES
	fix="nvidia-smi -L lists them; unset CUDA_VISIBLE_DEVICES for every GPU, or --cpu for none"
	case $cvd in *[!A-Za-z0-9,\ -]*) die "CUDA_VISIBLE_DEVICES holds what is no GPU index or UUID: give them comma-separated ($fix)" ;; esac
	have=$(printf '%s\n' "$SMI" | sed -n 's/^GPU \([0-9]*\):.*/\1/p' | awk '{ printf "%s%s", sep, $0; sep = ", " }')
	COUNT=0
	rest=$cvd,
	while [ -n "$rest" ]; do
		token=$(printf '%s' "${rest%%,*}" | sed 's/^ *//; s/ *$//') rest=${rest#*,}
		case $token in GPU-*|MIG-*) ;; ''|*[!0-9]*) break ;; esac  # names no device: CUDA reads no further
		case $token in MIG-*) die "CUDA_VISIBLE_DEVICES=$(short "$cvd") names a MIG device ($(short "$token")): runs take whole GPUs; name the GPU, or turn MIG off (nvidia-smi -mig 0)" ;; esac
		index=$(printf '%s\n' "$SMI" | awk -v t="$token" '/^GPU [0-9]+:/ { i = substr($2, 1, length($2) - 1); u = $NF
			sub(/\)$/, "", u); if ((t ~ /^[0-9]+$/ && t + 0 == i + 0) || t == u || (t ~ /^GPU-./ && index(u, t) == 1)) {
			hit = i; n++ } } END { if (n > 1) print "several"; else if (n) print hit }')
		[ "$index" != several ] || die "$(short "$token") (from CUDA_VISIBLE_DEVICES=$(short "$cvd")) starts the UUID of several GPUs: give more of it ($fix)"
		[ -n "$index" ] || die "GPU $(short "$token") (from CUDA_VISIBLE_DEVICES=$(short "$cvd")) is not on this node: it has ${have:-none} ($fix)"
		case ",$chosen," in *",$index,"*) ;; *) chosen=$chosen${chosen:+,}$index COUNT=$((COUNT + 1)) ;; esac
	done
	[ -n "$chosen" ] || die "CUDA_VISIBLE_DEVICES='$(short "$cvd")' hides every GPU, as CUDA reads it ($fix)"
	if [ -n "$(printf '%s' "$rest" | tr -d ', ')" ]; then
		if [ -n "$token" ]; then token="entry '$(short "$token")'"; else token="empty entry"; fi
		printf '%s\n' "run.sh: CUDA_VISIBLE_DEVICES=$(short "$cvd") leaves GPU $chosen: CUDA reads no further than its $token" >&2
	fi
	GPUS="\"device=$chosen\""
}
# With no --image: the dockyard image of the archive sets beside this script (their manifests name them and their ids,
# as load.sh reads them) that is loaded here as that set holds it; of several, those this node's driver runs, then the
# image the script was written for; that image where no dockyard set is beside it.
DEFAULT=@IMAGE_DEFAULT_Q@
image_of_the_set() {
	case $0 in */*) here run.sh "${0%/*}/" ;; *) HERE=./ ;; esac
	found= archives= other= skipped=0
	for m in "$HERE"*.manifest.json; do
		grep -q '"dockyard.variant"' "$m" 2>/dev/null || continue  # a set of other images (invoke save takes any)
		images=$(sed -n 's/^    "check_images": "\(.*\)",\{0,1\}$/\1/p' "$m" 2>/dev/null)
		[ -n "$images" ] || continue
		name=$(sed -n 's/^  "archive": "\(.*\)",$/\1/p' "$m")
		# said below as it is: an escape sequence in either would drive the terminal (no name invoke save writes has one)
		printable "${m##*/}$name" || { skipped=$((skipped + 1)); continue; }
		archives="$archives${archives:+, }${name:-${m##*/}}"
		for pair in $images; do
			ref=${pair%%=*} id=${pair#*=}
			case "$ref" in '' | -* | *[!A-Za-z0-9._/:@-]*) continue ;; esac
			case " $found " in *" $ref "*) continue ;; esac
			got=$(docker image inspect --format '{{.Id}} {{index .Config.Labels "dockyard.variant"}}' "$ref" 2>/dev/null) \
				|| continue
			[ -n "${got#* }" ] || continue  # not a dockyard image
			if [ "${got%% *}" = "$id" ]; then found="$found${found:+ }$ref"; else other="$other${other:+ }$ref"; fi
		done
	done
	[ "$skipped" -eq 0 ] || echo "run.sh: skipped $skipped archive manifest(s) beside run.sh whose name, or the archive name in it, holds a control character or a byte outside ASCII, which none invoke save writes holds (said as it is, an escape sequence would drive the terminal)" >&2
	[ -n "$archives" ] || { IMAGE=$DEFAULT; return; }
	[ -n "$found" ] || [ -z "$other" ] \
		|| die "$other here is another build than the one in the archives here ($archives): load theirs, sh load.sh NAME (or --image=REF)"
	if [ -z "$found" ]; then
		case "$archives" in
		*', '*) die "no image of the archives here ($archives) is loaded: load one first, sh load.sh NAME" ;;
		*) die "the image of $archives is not loaded here: load it first, sh load.sh $archives" ;;
		esac
	fi
	case "$found" in *' '*) found=$(runnable $found) ;; esac
	case "$found" in *' '*) case " $found " in *" $DEFAULT "*) found=$DEFAULT ;; esac ;; esac
	case "$found" in *' '*) die "several images of the archives here are loaded ($(printf '%s' "$found" | sed 's/ /, /g')): pick one, --image=REF" ;; esac
	IMAGE=$found
}
# Whether a name is printable ASCII (load.sh's printable())
printable() { [ "$(printf '%s' "$1" | LC_ALL=C tr -d ' -~' | wc -c | tr -d ' ')" -eq 0 ]; }
# Of the images $@, those this node's driver runs; all of them with --cpu, without a working driver or where none runs.
runnable() {
	{ [ -z "$CPU" ] && command -v nvidia-smi >/dev/null 2>&1 && SMI=$(nvidia-smi 2>&1); } || { echo "$*"; return; }
	driver_facts
	kept=
	for ref do
		runs "$(cuda_of "$ref")"
		[ $? -eq 1 ] || kept="$kept${kept:+ }$ref"
	done
	echo "${kept:-$*}"
}
# A recipe name the image holds none of ($RECIPES), refused as invoke run refuses it (recipes.load_recipe), with its
# did-you-mean; a path that is no recipe folder on this node nor inside the image (the probe's `in-image`), too: the
# trainer refused `--recipe=/host/typo` only once the run's container had started. Where the image listed no recipes
# (its probe failed), the trainer judges it, as before.
known_recipe() {
	[ -n "$RECIPES" ] || return 0
	NL='
'  # $RECIPES holds a name a line: one may hold a blank (invoke run takes recipes/my recipe/ too)
	case $RECIPE in */*) recipe_path; return 0 ;; *"$NL"*) ;; *) case "$NL$RECIPES$NL" in *"$NL$RECIPE$NL"*) return 0 ;; esac ;; esac
	near=$(closest "$RECIPE" "$RECIPES")
	why=${near:+did you mean $near? }
	[ ! -d "$HERE" ] || why="the folder $(short "$RECIPE" 120) here holds no recipe.yaml; "
	[ -z "$RESUME" ] || [ -n "$RECIPE_GIVEN" ] || why="the run $(short "$RUN_ID") trained with it: give its folder again (--recipe=FOLDER), or "
	die "--recipe=$(short "$RECIPE"): image $(short "$IMAGE") holds no recipe $(short "$RECIPE"): ${why}pick one of $(printf '%s\n' "$RECIPES" | awk 'NR > 1 { printf ", " } { printf "%s", $0 }') or give a folder that holds a recipe.yaml"
}
# A --recipe path ($HERE: here's) that holds no recipe.yaml on this node: taken where it is a recipe's folder inside the
# image, else refused in load_recipe's words
recipe_path() {
	case "$NL$PROBE$NL" in *"${NL}in-image$NL"*) return 0 ;; esac
	pick="pick one of $(printf '%s\n' "$RECIPES" | awk 'NR > 1 { printf ", " } { printf "%s", $0 }')"
	[ ! -d "$HERE" ] || die "--recipe=$(short "$RECIPE" 120): the folder holds no recipe.yaml: give a folder that holds one, or $pick"
	[ "${HERE##*/}" != recipe.yaml ] || [ ! -f "$HERE" ] || die "--recipe=$(short "$RECIPE" 120) is a file: give the folder that holds it, --recipe=$(short "$(dirname -- "$RECIPE")" 120)"
	die "--recipe=$(short "$RECIPE" 120): no such folder on this node, nor in image $(short "$IMAGE")$(near_path "$HERE"): give a folder that holds a recipe.yaml, or $pick"
}
# closest_recipe (dockyard/common/recipes.py) in awk: of the names $2 (one a line), the one the name $1 most likely
# meant, or nothing; of run.sh's options too (unknown_option).
# The same letters and digits (ZeRO2, zero_2), zero2 for DeepSpeed, else difflib.get_close_matches(name, names, 1,
# 0.75): the name of the highest SequenceMatcher ratio, twice the characters of the blocks the two have in common (the
# longest first, earliest in the name; then the same on either side of it) over both lengths; the last of equal ones. The
# name reaches awk through the environment: awk -v reads the escapes in it (lor\141 was lora).
closest() {
	NAMES=$2 GIVEN=$1 awk '
	function plain(s) { s = tolower(s); gsub(/[^a-z0-9]/, "", s); return s }
	function common(a, b,   n, m, lo, hi, blo, bhi, i, j, k, best, bi, bj) {
		n = 1; LO[1] = 0; HI[1] = length(a); BLO[1] = 0; BHI[1] = length(b)
		while (n > 0) {
			lo = LO[n]; hi = HI[n]; blo = BLO[n]; bhi = BHI[n]; n--
			best = 0; split("", prev)
			for (i = lo; i < hi; i++) {
				split("", cur)
				for (j = blo; j < bhi; j++) if (substr(a, i + 1, 1) == substr(b, j + 1, 1)) {
					k = cur[j] = ((j - 1) in prev ? prev[j - 1] : 0) + 1
					if (k > best) { best = k; bi = i - k + 1; bj = j - k + 1 }
				}
				split("", prev); for (j in cur) prev[j] = cur[j]
			}
			if (!best) continue
			m += best
			n++; LO[n] = lo; HI[n] = bi; BLO[n] = blo; BHI[n] = bj
			n++; LO[n] = bi + best; HI[n] = hi; BLO[n] = bj + best; BHI[n] = bhi
		}
		return m
	}
	BEGIN {
		given = ENVIRON["GIVEN"]; n = split(ENVIRON["NAMES"], names, "\n"); g = plain(given); w = tolower(given)
		if ((g == "deepspeed" || g == "ds" || g == "zero") && index("\n" ENVIRON["NAMES"] "\n", "\nzero2\n")) {
			print "zero2 (DeepSpeed ZeRO-2)"; exit
		}
		for (i = 1; i <= n; i++) if (plain(names[i]) == g) { print names[i]; exit }
		for (i = 1; i <= n; i++) {
			r = 2 * common(names[i], w) / (length(names[i]) + length(w))
			if (r >= 0.75 && (r > top || (r == top && (names[i] "") > (pick "")))) { top = r; pick = names[i] }
		}
		if (pick != "") print pick
	}'
}

# Of a path that is not there, the entry beside it whose name is closest (chat.jsnl for chat.jsonl) as " (did you
# mean PATH?)", else nothing: as invoke run (common/tree.near), of the first thousand entries, printable ones only.
near_path() {
	dir=$(dirname -- "$1") names= n=0
	[ -d "$dir" ] || return 0
	for f in "$dir"/* "$dir"/.[!.]*; do
		[ -e "$f" ] || continue
		n=$((n + 1)) names="$names${f##*/}
"
		[ "$n" -lt 1000 ] || break
	done
	meant=$(closest "$(basename -- "$1")" "$(printf '%s' "$names" | LC_ALL=C grep -v '[^ -~]')")
	case $meant in '' | *' (DeepSpeed ZeRO-2)') ;; *) printf ' (did you mean %s/%s?)' "${dir%/}" "$meant" ;; esac
}
# An option run.sh does not take, answered as invoke run answers a flag it lacks: invoke run's flags that run.sh has
# another way for, a switch given a value, a value after a space, else the option it most likely meant.
unknown_option() {
	name=${1%%=*} value= typed=$(short "$1")
	[ "$name" = "$1" ] || value=$(short "${1#*=}")
	case $name in
	--gpus) die "unknown option $typed: run.sh takes the GPUs from CUDA_VISIBLE_DEVICES, as in CUDA_VISIBLE_DEVICES=${value:-0,2} sh run.sh ..." ;;
	--variant) die "unknown option $typed: run.sh trains in a loaded image: give it as --image=${DEFAULT%-*}-${value:-VARIANT} (sh load.sh its archive first)" ;;
	--native | --nodes | --node-rank | --master-addr | --master-port | --iface | --join-timeout | --max-restarts)
		die "unknown option $typed: run.sh trains in the image on this node alone; several nodes, or a host's own Python, take invoke run (the checkout and a venv: README, Air-gapped step 5)" ;;
	--cpu | --dry | --resume | --disable-require | --help)
		[ "$name" = "$1" ] || die "$name is a switch and takes no value: give $name alone" ;;
	--recipe | --data | --model | --run-id | --runs | --nproc | --image)
		[ "$name" != "$1" ] || die "$1 needs its value after '=', as in $1=VALUE (options take the form --name=value)" ;;
	esac
	near=$(case $name in --?*) closest "${name#--}" "$OPTIONS" ;; esac)
	die "unknown option $typed (${near:+did you mean --$near? }options take the form --name=value; trainer overrides go after --)"
}
OPTIONS='recipe
data
model
run-id
runs
nproc
image
cpu
disable-require
dry
resume
help'  # the options the loop below takes, a name a line

RECIPE=@DEFAULT_RECIPE@ RECIPE_GIVEN= DATA= MODEL= RUN_ID= RUNS=./runs NPROC= CPU= DRY= IMAGE= IMAGE_GIVEN= DISABLE_REQUIRE= RESUME=
while [ $# -gt 0 ]; do
	case "$1" in
	--recipe=*) RECIPE=${1#*=} RECIPE_GIVEN=1 ;;
	--data=*) DATA=${1#*=} ;;
	--model=*) MODEL=${1#*=} ;;
	--run-id=*) RUN_ID=${1#*=} ;;
	--runs=*) RUNS=${1#*=} ;;
	--nproc=*) NPROC=${1#*=} ;;
	--image=*) IMAGE=${1#*=} IMAGE_GIVEN=1 ;;
	--cpu) CPU=1 ;;
	--disable-require) DISABLE_REQUIRE=1 ;;
	--dry) DRY=1 ;;
	--resume) RESUME=1 ;;
	-h | --help) sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0"; exit 0 ;;
	--) shift; break ;;
	*) unknown_option "$1" ;;
	esac
	shift
done

# Paths after --: not mounted (the trainer would look for them inside the container), and --data before -- came
# after them in the trainer's command and won
for a do
	case "$a" in
	--data | --data=* | --model | --model=*) die "${a%%=*} after --: a path there is not mounted; give it before -- (${a%%=*}=PATH): run.sh mounts it read-only" ;;
	--eval_data | --eval_data=*) die "--eval_data after --: run.sh mounts --data and --model only; hold out a share of --data instead (-- --eval_fraction 0.05), or use invoke run --data=... -- --eval_data PATH" ;;
	esac
done
[ -z "$IMAGE_GIVEN" ] || case $IMAGE in '' | -* | *[[:cntrl:][:space:]]*) die "--image=$(short "$IMAGE") is not an image reference" ;; esac
[ -n "$RECIPE" ] || die "--recipe= needs a recipe name or folder"

command -v docker >/dev/null 2>&1 || die "docker is missing on this node: install Docker"
engine
# The host's shared memory and whose the run's files are (dockyard/engine.py host_sharing_flags): rootless Docker
# maps the container's root to this user and every other uid to a subordinate one, and cannot share the host's IPC;
# userns-remap maps them all, so the container leaves it.
case $(docker info --format '{{json .SecurityOptions}}' 2>/dev/null) in
*name=rootless*) HOST_FLAGS="--shm-size=@ROOTLESS_SHM@ --user 0:0" ;;
*name=userns*) HOST_FLAGS="--userns=host --ipc=host --user $(id -u):$(id -g)" ;;
*) HOST_FLAGS="--ipc=host --user $(id -u):$(id -g)" ;;
esac
[ -n "$IMAGE_GIVEN" ] || image_of_the_set
VARIANT=$(docker image inspect --format '{{index .Config.Labels "dockyard.variant"}}' "$IMAGE" 2>/dev/null) \
	|| die "image $(short "$IMAGE") is not loaded here: sh load.sh first (or --image=REF)"
IMAGE_ID=$(docker image inspect --format '{{.Id}}' "$IMAGE")
# A container cannot lock more memory than the engine itself may, and gets the engine's limit by default: ask
# for unlimited (NCCL, RDMA) only where the engine has it. The same container lists the recipes the image holds (the
# folders the trainer looks a name up in), and says whether --recipe is a folder with a recipe.yaml inside the image
# (a line `in-image`): a misspelt --recipe, a name or a path, is refused before the run's container starts.
PROBE=$(docker run --rm --entrypoint sh "$IMAGE" -c \
	'ulimit -H -l; for f in @IMAGE_RECIPES@/*/recipe.yaml; do [ ! -f "$f" ] || echo "${f%/recipe.yaml}"; done
	[ ! -f "$1/recipe.yaml" ] || echo in-image' sh "$RECIPE" 2>/dev/null)
MEMLOCK=$(printf '%s\n' "$PROBE" | head -n 1)
RECIPES=$(printf '%s\n' "$PROBE" | sed -n '2,$s|.*/||p' | LC_ALL=C sort)  # one a line: a name may hold a blank
case "$MEMLOCK" in unlimited | '' | *[!0-9]*) MEMLOCK=-1 ;; *) MEMLOCK=$((MEMLOCK * 1024)) ;; esac

# A CUDA image trains on the node's GPUs unless --cpu. A node without an NVIDIA driver (no nvidia-smi) trains on CPU;
# a driver that is there but fails (one upgraded without a reboot) stops the run: torch would find no GPU either.
GPUS=
if [ "$VARIANT" = cpu ] || [ -n "$CPU" ]; then
	:
elif ! command -v nvidia-smi >/dev/null 2>&1; then
	echo "run.sh: no NVIDIA driver here (no nvidia-smi): training on CPU in the $VARIANT image" >&2
	CPU=1
else
	smi
	driver_facts
	smi -L
	docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia || command -v nvidia-container-runtime-hook >/dev/null 2>&1 \
		|| die "GPUs found, but Docker has no NVIDIA runtime: install the NVIDIA Container Toolkit, run nvidia-ctk runtime configure --runtime=docker, restart dockerd (or --cpu)"
	GPUS=all COUNT=$(printf '%s\n' "$SMI" | grep -c '^GPU')
	visible
	check_archs  # before the driver: a newer driver runs no torch without the GPUs' code
	check_driver
	[ -n "$DISABLE_REQUIRE" ] || check_require
	[ -n "$NPROC" ] || NPROC=$COUNT
fi
[ -n "$NPROC" ] || NPROC=@CPU_NPROC@
# invoke run's range (dockyard/flags.py): 1 to 4096; the length first, so that test never reads an overflowing number
case "$NPROC" in '' | *[!0-9]* | 0*) die "--nproc=$(short "$NPROC"): give a whole number of processes from 1 to 4096" ;; esac
[ ${#NPROC} -le 4 ] && [ "$NPROC" -le 4096 ] || die "--nproc=$(short "$NPROC"): give a whole number of processes from 1 to 4096"
[ -z "$GPUS" ] || [ "$NPROC" -le "$COUNT" ] \
	|| die "--nproc=$(short "$NPROC") but this node has $COUNT GPU(s)${CUDA_VISIBLE_DEVICES:+ in CUDA_VISIBLE_DEVICES}: one process per GPU"

# Inputs: a file is mounted alone, a folder whole, both read-only (as `invoke run` does).
MOUNTS= EXTRA= HOST_PATHS=
# A mount's host path, for the trainer (DOCKYARD_HOST_PATHS): an input's for the manifest's record, and every mount's
# for the lines it prints, which name this node's paths, not the container's (as invoke run shows them)
on_host() { HOST_PATHS="$HOST_PATHS${HOST_PATHS:+, }\"$(json "$1")\": \"$(json "$2")\""; }  # inside host
input() {  # key host-path
	mountable "--$1" "$2"
	here "--$1" "$2"; path=$HERE
	[ -e "$path" ] || die "--$1=$(short "$2" 120): no such file or folder on this node$(near_path "$path")"
	# what the trainer would refuse once the run folder is made (as invoke run checks it on its host)
	if [ "$1" = model ]; then
		if [ ! -f "$path/config.json" ]; then
			[ -f "$path/adapter_config.json" ] && die "--model=$(short "$2" 120): a LoRA adapter (adapter_config.json), not a model: pass the base it was trained on, or merge the two into one model folder first (invoke export --run=ID --merge)"
			die "--model=$(short "$2" 120): not a model folder (no config.json in it): give the folder from_pretrained reads (config.json, weights, tokenizer)"
		fi
		[ -f "$path/adapter_config.json" ] && die "--model=$(short "$2" 120): holds a LoRA adapter (adapter_config.json) beside the model, which transformers would load on top of it: merge them into one model folder first (invoke export --run=ID --merge), or move adapter_config.json out to train the base alone"
	elif [ -f "$path" ]; then
		suffix=.${path##*.}
		case "${path##*/}" in *.*) ;; *) suffix='(none)' ;; esac
		case " @DATA_SUFFIXES@ " in *" $suffix "*) ;; *) die "--data=$(short "$2" 120): unknown data file type $suffix; use @DATA_SUFFIXES@ (docs/data.md)" ;; esac
	elif [ ! -d "$path" ]; then
		die "--data=$(short "$2" 120): neither a file nor a folder (a device, pipe or socket): give a data file, or a folder of them"
	fi
	host=$(cd "$(dirname "$path")" && pwd)/$(basename "$path")
	mountable "--$1" "$host"
	if [ -d "$path" ]; then inside=@INPUTS@/$1; else inside=@INPUTS@/$1/$(basename "$path"); fi
	MOUNTS="$MOUNTS $(q -v) $(q "$host:$inside:ro")"
	EXTRA="$EXTRA $(q "--$1") $(q "$inside")"
	on_host "$inside" "$host"
}
[ -z "$MODEL" ] || input model "$MODEL"
[ -z "$DATA" ] || input data "$DATA"
run_id_ok() {
	case "$RUN_ID" in [A-Za-z0-9]*) ;; *) die "--run-id=$(short "$RUN_ID"): start with a letter or digit" ;; esac
	case "$RUN_ID" in *[!A-Za-z0-9_.-]*) die "--run-id=$(short "$RUN_ID"): use letters, digits, '_', '.' and '-'" ;; esac
}
# A resumed run continues with its own recipe (its manifest's), unless --recipe names it again (a folder of yours)
if [ -n "$RESUME" ]; then
	[ -n "$RUN_ID" ] || die "--resume needs --run-id=ID: the run to continue, a folder in --runs ($(short "$RUNS" 120))"
	run_id_ok
	here --runs "$RUNS"
	[ -f "$HERE/$RUN_ID/manifest.json" ] || die "--resume: $(short "$RUNS/$RUN_ID" 120) holds no run (no manifest.json): check --run-id and --runs"
	was=$(sed -n 's/^  "recipe": "\(.*\)",$/\1/p' "$HERE/$RUN_ID/manifest.json")
	[ -n "$RECIPE_GIVEN" ] || RECIPE=${was:-$RECIPE}
fi
RECIPE_IN=$RECIPE
here --recipe "$RECIPE"
[ -f "$HERE/recipe.yaml" ] || known_recipe
if [ -f "$HERE/recipe.yaml" ]; then
	mountable --recipe "$RECIPE"
	folder=$(cd "$HERE" && pwd)
	mountable --recipe "$folder"
	RECIPE_IN=@USER_RECIPES@/${folder##*/}
	MOUNTS="$MOUNTS $(q -v) $(q "$folder:$RECIPE_IN:ro")"
	on_host "$RECIPE_IN" "$folder"
fi
# the recipe's name in a run id as invoke run writes it: letters, digits, _ . - (others become -), 64 at most
CHOSEN=  # the id run.sh chose: of runs started in the same second, each claims the first free of it, its -2, -3, ...
if [ -z "$RUN_ID" ]; then
	CHOSEN=1
	RUN_ID=$(printf '%s' "${RECIPE_IN##*/}" | tr -c 'A-Za-z0-9_.-' '-' | sed 's/^[-._]*//' | cut -c1-64)
	RUN_ID=${RUN_ID:-run}-$(date +%Y%m%d-%H%M%S)
fi
run_id_ok
mountable --runs "$RUNS"
here --runs "$RUNS"
mkdir -p "$HERE" || die "cannot make the runs folder $(short "$RUNS" 120)"
RUNS=$(cd "$HERE" && pwd)
mountable --runs "$RUNS"
RUN_DIR=$RUNS/$RUN_ID
[ -n "$RESUME$CHOSEN" ] || [ ! -e "$RUN_DIR/manifest.json" ] || die "$(short "$RUN_DIR" 120) already holds a run: pick another --run-id, or continue it (--resume)"
# Never a folder in /tmp: another user could have made /tmp/.cache/huggingface first, and it is mounted read-write
[ -n "${HF_HOME:-}${HOME:-}" ] || die "neither HF_HOME nor HOME is set: set HF_HOME to your Hugging Face cache (a folder of yours)"
# torch.compile's and Triton's caches: the kernels one run compiled, loaded by the next instead of compiled again. The
# runs execute what is in it, so it is a folder of this user's that nobody else can write (as invoke run's
# compile_cache setting; DOCKYARD_COMPILE_CACHE names another)
[ -n "${DOCKYARD_COMPILE_CACHE:-}${HOME:-}" ] || die "neither DOCKYARD_COMPILE_CACHE nor HOME is set: set DOCKYARD_COMPILE_CACHE to a folder of yours for the compile cache"
COMPILE=${DOCKYARD_COMPILE_CACHE:-$HOME/.cache/dockyard/compile}
mountable DOCKYARD_COMPILE_CACHE "$COMPILE"
here DOCKYARD_COMPILE_CACHE "$COMPILE"
[ -e "$HERE" ] || (umask 077 && mkdir -p "$HERE") || die "cannot make the compile cache $(short "$COMPILE" 120): set DOCKYARD_COMPILE_CACHE to a folder you can write"
[ -d "$HERE" ] || die "the compile cache $(short "$COMPILE" 120) is not a folder: set DOCKYARD_COMPILE_CACHE to a folder of yours"
COMPILE=$(cd "$HERE" && pwd -P)
mountable DOCKYARD_COMPILE_CACHE "$COMPILE"
[ -O "$COMPILE" ] || die "the compile cache $(short "$COMPILE" 120) is not yours, and runs execute the code compiled into it: set DOCKYARD_COMPILE_CACHE to a folder of yours"
case $(ls -ld "$COMPILE") in ?????w???[tT]* | ????????w[tT]*)
	die "the compile cache $(short "$COMPILE" 120) is a folder every user shares, and runs execute the code compiled into it: set DOCKYARD_COMPILE_CACHE to a folder of yours" ;;
?????w* | ????????w*)
	die "the compile cache $(short "$COMPILE" 120) can be written by others, and runs execute the code compiled into it: chmod go-w $COMPILE, or set DOCKYARD_COMPILE_CACHE to a folder of yours" ;;
esac
HF=${HF_HOME:-$HOME/.cache/huggingface}
mountable HF_HOME "$HF"
here HF_HOME "$HF"
mkdir -p "$HERE" || die "cannot make $(short "$HF" 120)"
HF=$(cd "$HERE" && pwd)  # docker -v takes a relative path for a volume's name
mountable HF_HOME "$HF"
# The run folder last, once nothing above can refuse (a refusal left an empty one), and taken away again by --dry and
# a run that never began only where this run.sh made it (--dry --run-id=ID removed an empty folder of the user's).
MADE=
if [ -n "$CHOSEN" ]; then  # one mkdir each, as invoke run claims it: of two runs, one gets the folder
	base=$RUN_ID n=1
	until mkdir "$RUN_DIR" 2>/dev/null; do
		[ -e "$RUN_DIR" ] || [ -L "$RUN_DIR" ] || die "cannot make the run folder $(short "$RUN_DIR" 120)"
		n=$((n + 1))
		[ "$n" -le 99 ] || die "run folders $(short "$RUNS/$base" 120) to $(short "$base")-99 are all taken: give the run an id of its own (--run-id=ID)"
		RUN_ID=$base-$n RUN_DIR=$RUNS/$base-$n
	done
	MADE=1
elif [ ! -d "$RUN_DIR" ]; then  # (a folder there already: --resume's, or one made for the run)
	mkdir -p "$RUN_DIR" || die "cannot make $(short "$RUN_DIR" 120)"
	MADE=1
fi

# The command `invoke run` would give (rendered from its plan by dockyard/launch/runscript.py):
@COMMAND@

if [ -n "$DRY" ]; then printf '%s\n' "$cmd"; [ -z "$MADE" ] || rmdir "$RUN_DIR" 2>/dev/null; exit 0; fi
printf '%s\n' "run.sh: ${RESUME:+resuming }training $RECIPE_IN in $IMAGE ($VARIANT${GPUS:+, GPUs}${CPU:+, CPU}), $NPROC process(es) → $RUN_DIR" >&2
eval "$cmd"
rc=$?
if [ ! -f "$RUN_DIR/manifest.json" ]; then
	# stopped before its run folder was its own (an unknown recipe, say): the empty folder goes, its reason is above
	rmdir "$RUN_DIR" 2>/dev/null && die "the run stopped before it began (exit $rc): its reason is above"
	die "the run wrote no manifest (exit $rc): see $RUN_DIR/train.log"
fi
status=$(sed -n 's/^  "status": "\(.*\)",$/\1/p' "$RUN_DIR/manifest.json")
printf '%s\n' "run $RUN_ID: ${status:-unknown} · $RUN_DIR"
[ "$rc" -eq 0 ] && [ "$status" = completed ] || exit 1
