#!/usr/bin/env python3
"""Tiny hostile exec workers for attest's adversarial suite (tools/adversarial/
run_adversarial.py; docs/reliability.md). Standard library only, so that each start costs
milliseconds. `--mode` picks the attack; every mode answers describe like a small f32
kernel unless the attack is in describe itself:

  deep-describe  describe reply nested 60 000 levels deep
  huge-head-dim  describe claims head_dims [1000000] (the suite would allocate gigabytes)
  deep-reply     forward reply {"status": "ok", "x": [[[...]]]} 60 000 levels deep
  dup-reply      forward reply {"status": "error", "message": "m", "status": "ok"}
  fifo-out       makes the outputs path a FIFO, then replies ok
  symlink-out    makes the outputs path a symlink to /dev/zero, then replies ok
  huge-out       makes the outputs path a 16 GiB sparse file, then replies ok
  wide-out       writes an outputs file whose header lists 100 000 tensors, then replies ok
  hang           never answers forward
  hang-escape    on forward, starts a grandchild that leaves the worker's session and
                 process group (fork, setsid, fork) and spins, then hangs; the grandchild's
                 pid goes to --pid-file
"""

import argparse
import json
import os
import struct
import sys
import time

CAPS = {"dtypes": ["f32"], "head_dims": [], "head_dims_v": [], "causal": True,
        "backward": True, "profile": "f32"}
DEEP = 60000


def reply(obj_or_text):
    text = obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def escape_and_spin(pid_file):
    """A process that a process-group kill does not reach: double fork with setsid."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pid_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pid_file + ".tmp", pid_file)
            while True:
                pass
        os._exit(0)
    deadline = time.time() + 5
    while not os.path.exists(pid_file) and time.time() < deadline:
        time.sleep(0.01)


def write_wide_outputs(path, count):
    header = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
              for i in range(count)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--pid-file", default="")
    args = parser.parse_args()
    mode = args.mode
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "describe":
            if mode == "deep-describe":
                reply('{"status":"ok","name":"deep","capabilities":' + "[" * DEEP + "]" * DEEP + "}")
            elif mode == "huge-head-dim":
                caps = dict(CAPS, head_dims=[1000000], head_dims_v=[1000000])
                reply({"status": "ok", "name": "huge-head-dim", "capabilities": caps})
            else:
                reply({"status": "ok", "name": "hostile-" + mode, "capabilities": CAPS})
            continue
        out = request["outputs"]
        if mode == "deep-reply":
            reply('{"status":"ok","x":' + "[" * DEEP + "]" * DEEP + "}")
        elif mode == "dup-reply":
            reply('{"status":"error","message":"m","status":"ok"}')
        elif mode == "fifo-out":
            os.mkfifo(out)
            reply({"status": "ok"})
        elif mode == "symlink-out":
            os.symlink("/dev/zero", out)
            reply({"status": "ok"})
        elif mode == "huge-out":
            with open(out, "wb") as f:
                f.truncate(16 << 30)
            reply({"status": "ok"})
        elif mode == "wide-out":
            write_wide_outputs(out, 100000)
            reply({"status": "ok"})
        elif mode in ("hang", "hang-escape"):
            if mode == "hang-escape":
                escape_and_spin(args.pid_file)
            while True:
                time.sleep(60)
        else:
            reply({"status": "error", "message": "unknown mode " + mode})


if __name__ == "__main__":
    main()
