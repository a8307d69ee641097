#!/bin/sh
# Before the files are removed: deb prerm (remove|upgrade|deconfigure|failed-upgrade),
# rpm %preun (0 on removal, 1 on upgrade).
set -e

site=/usr/lib/pg_exporter/site-packages

case "$1" in
    remove | 0)
        if [ -d /run/systemd/system ]; then
            systemctl stop pg_exporter.service >/dev/null 2>&1 || true
        fi
        if command -v systemctl >/dev/null 2>&1; then
            systemctl --no-reload disable pg_exporter.service >/dev/null 2>&1 || true
        fi
        ;;
esac

# The byte-code is ours, not the package's: remove it so no directory is left behind.
# On an rpm upgrade ($1 = 1) the new %post has already compiled the new files.
if [ "$1" != 1 ] && [ -d "$site" ]; then
    find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
fi
exit 0
