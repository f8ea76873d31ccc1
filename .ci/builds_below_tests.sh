#!/usr/bin/env bash
# Keeps the engine's build steps below everything else on the CPU while CI runs (process $1, .ci/run): each second,
# the processes of every build step (the engine puts them in the cgroup docker/buildkit/<step>) move to a cgroup of
# their own at the lowest CPU share. There they take only the CPU that the tests leave idle, whether a
# test trains in a container (docker/<id>) or natively (the root cgroup, beside which docker/buildkit's own share
# would still take half of the 2 cores). CPU only: their memory and disk traffic are the engine's as before. On
# cgroup v1 only the cpu controller moves (the engine still stops each step through its other cgroups); on v2 a
# process moves whole, and the engine still stops the step by its process.
set -u
if [ -d /sys/fs/cgroup/cpu ]; then
  root=/sys/fs/cgroup/cpu; share=cpu.shares; lowest=2
else
  root=/sys/fs/cgroup; share=cpu.weight; lowest=1
fi
low=$root/ci-builds
mkdir -p "$low" && echo "$lowest" >"$low/$share" || { echo "ci: cannot lower the builds' CPU share"; exit 1; }
while kill -0 "$1" 2>/dev/null && sleep 1; do
  for procs in "$root"/docker/buildkit/*/cgroup.procs "$root"/system.slice/docker.service/buildkit/*/cgroup.procs; do
    [ -f "$procs" ] || continue
    while read -r pid; do echo "$pid" >"$low/cgroup.procs"; done <"$procs" 2>/dev/null
  done
done
