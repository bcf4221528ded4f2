#!/usr/bin/env python3
"""A nightly backup as a tracked job, with the Python client (pip install ./clients/python).

    DISPATCH_URL=http://127.0.0.1:8080 DISPATCH_TOKEN=$(cat .dispatch/dev-key) \
        python3 nightly-backup.py /srv/data /mnt/backup

From cron (a publish key of its own in a file only cron's user reads):
    15 2 * * * DISPATCH_URL=https://dispatch.example.com DISPATCH_TOKEN_FILE=/etc/dispatch/backup-key python3 /usr/local/bin/nightly-backup.py /srv/data /mnt/backup

The job ends `completed`, or `error` with the exception's message when anything raises (the
script then exits non-zero, so cron's mail still tells you): it is never left hanging.
"""
import os
import shutil
import socket
import sys
import time

from dispatch_client import Client

source, target = sys.argv[1], sys.argv[2]
files = [os.path.join(d, f) for d, _, names in os.walk(source) for f in names]

with Client().activity("Nightly backup", machine=socket.gethostname().split(".")[0],
                       system_image="externaldrive.fill", stale_after=3600) as job:
    last = 0.0
    for i, path in enumerate(files, 1):
        copy = os.path.join(target, os.path.relpath(path, source))
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copy2(path, copy)
        if time.monotonic() - last >= 1 or i == len(files):  # at most one update a second
            job.progress(i / len(files), f"{i}/{len(files)} files")
            last = time.monotonic()
    print(f"backed up {len(files)} files as {job.id}")
