#!/usr/bin/env bash
# Writes hearth(1), a man page made of the command's own --help pages (which are generated from
# the flag table, so the man page cannot drift from the flags): gen-man.sh HEARTH_BIN OUT VERSION
set -euo pipefail
bin=$1 out=$2 version=$3
# roff: a backslash must be doubled, a line starting with . or ' escaped
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
{
    echo ".TH HEARTH 1 \"\" \"hearth $version\" \"User Commands\""
    echo ".SH NAME"
    echo "hearth \\- run large language models across the devices of a household"
    echo ".SH SYNOPSIS"
    echo ".B hearth"
    echo ".I COMMAND"
    echo "[options]"
    echo ".SH DESCRIPTION"
    echo ".nf"
    "$bin" --help | esc
    echo ".fi"
    for cmd in $("$bin" --help | sed -n 's/^  \([a-z][a-z-]*\)  .*/\1/p'); do
        echo ".SH \"hearth $cmd\""
        echo ".nf"
        "$bin" "$cmd" --help | esc
        echo ".fi"
    done
    echo ".SH FILES"
    echo ".TP"
    echo "/etc/hearth/worker.conf, /etc/hearth/serve.conf"
    echo "flags of the hearth-worker and hearth-serve services"
    echo ".TP"
    echo "/var/cache/hearth"
    echo "the services' slice cache"
} > "$out"
