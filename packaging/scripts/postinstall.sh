#!/bin/sh
# After the files are unpacked: deb postinst (configure [OLD-VERSION] | abort-*),
# rpm %post (1 on install, 2 on upgrade).
# A first install never enables or starts the service: the operator points it at a
# database first. An upgrade restarts it only if it was running.
set -e

site=/usr/lib/pg_exporter/site-packages

# Byte-code for the interpreter the launcher names (its first line, "#!PYTHON -IS"):
# the service user cannot write __pycache__ here, and without it every start
# would compile aiohttp and psycopg again.
python=$(sed -n '1s/^#!\([^ ]*\).*/\1/p' /usr/bin/pg_exporter 2>/dev/null || true)
if [ -n "$python" ] && [ -x "$python" ] && [ -d "$site" ]; then
    "$python" -m compileall -q -j 0 "$site" >/dev/null ||
        echo "pg-exporter: could not precompile $site; the exporter will start slower" >&2
fi

upgrade=no
case "$1" in
    configure) [ -z "$2" ] || upgrade=yes ;;
    1) ;;
    [2-9]*) upgrade=yes ;;
esac

if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
    # deb restarts here; rpm restarts in %postun, once the old files are gone.
    if [ "$upgrade" = yes ] && [ "$1" = configure ]; then
        systemctl try-restart pg_exporter.service >/dev/null 2>&1 || true
    fi
fi
exit 0
