#!/bin/sh
# Before the files are unpacked: deb preinst (install|upgrade), rpm %pre (1|2).
# The service runs as the system user prometheus, shared with other exporters:
# create it and its group when missing, and never remove them.
set -e

if ! getent group prometheus >/dev/null; then
    groupadd --system prometheus
fi
if ! getent passwd prometheus >/dev/null; then
    useradd --system --gid prometheus --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "Prometheus exporters" prometheus
fi
exit 0
