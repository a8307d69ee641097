#!/bin/sh
# After the files are removed: deb postrm (remove|purge|upgrade|...),
# rpm %postun (0 on removal, 1 on upgrade).
set -e

if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    # rpm upgrade: the new files are in place and the old ones gone; restart if running.
    if [ "$1" = 1 ]; then
        systemctl try-restart pg_exporter.service >/dev/null 2>&1 || true
    fi
fi
exit 0
