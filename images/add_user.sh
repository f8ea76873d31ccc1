#!/bin/sh
# The image's user: `dockyard`, UID 1000 (runs are started with the host's UID:GID anyway; this is the user of
# `docker run` without --user). Bases that already have a UID 1000 (Ubuntu 24.04 ships `ubuntu`, so every
# nvidia/cuda:*-ubuntu24.04 image) get that user renamed, its group and home with it, instead of a failing useradd.
set -eu
existing=$(getent passwd 1000 | cut -d: -f1)
if [ -z "$existing" ]; then
    useradd --create-home --uid 1000 --shell /bin/bash dockyard
elif [ "$existing" != dockyard ]; then
    group=$(id -gn "$existing")
    usermod --login dockyard --home /home/dockyard --move-home --shell /bin/bash "$existing"
    [ "$group" = "$existing" ] && groupmod --new-name dockyard "$group"
fi
id dockyard
