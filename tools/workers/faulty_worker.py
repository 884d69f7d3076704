#!/usr/bin/env python3
"""A worker that misbehaves on purpose, for attest's isolation tests ("a worker
that exits mid-call"; kernels/exec/exec_kernel_test.cc). It is the NumPy worker,
except that a chosen request triggers a fault:

  crash          SIGSEGV itself          abort         SIGABRT (os.abort)
  exit           sys.exit(3) mid-call    hang          sleeps forever
  hang-child     starts `sleep` in its process group (pid written to --pid-file), then hangs
  garbage        replies with a line that is not JSON
  partial        writes half a reply, then exits
  noise          prints a stray line on the protocol stream before a correct reply
  no-file        replies "ok" without writing the outputs file
  missing        writes only the first output tensor
  wrong-shape    writes the first output with its axes reversed
  wrong-dtype    writes the first output as int32
  error          replies {"status": "error", "message": "deliberate failure"}
  error-exit     replies {"status": "error", ..., "exiting": true}, then exits (code 70) after
                 a pause in which attest could already have written its next request
  unsupported    replies {"status": "unsupported", "reason": "deliberate refusal"}
  bad-status     replies {"status": "maybe"}
  exit-early     exits (code 0) right after answering describe, without reading requests
  bad-describe   answers describe with garbage
  route          answers correctly, with the optional "route" field set to "slow path"
  exception      the kernel raises a Python TypeError inside attest_worker.serve, which
                 replies "error" with the exception line and prints the traceback to stderr
                 (as torch_worker.py does for a kernel called with a wrong keyword)
  raise          the worker itself dies of an uncaught TypeError (traceback on stderr,
                 exit code 1) before replying
  widen          answers correctly, with every output widened exactly from float32 to float64
                 (a worker's container is not its precision)
  history        answers correctly, except that every output element is one ulp higher when
                 the count of forward requests this worker process served before is odd (a
                 case's backward follows its forward's parity): its answer
                 to a case depends on what the process ran before (tools/campaign/
                 shards_test.sh: the merge of shards must then differ from one unsharded run)
  strides-ignored  answers as the NumPy worker, except that an input sent as a view
                 (docs/protocol.md "Views") is read as if it were contiguous: its storage's
                 first elements in row-major order (flash-attention #2665's class)
  chaos          the soak test's worker (docs/reliability.md): on a seeded random fraction
                 (--rate) of forward/backward calls, chosen from the call number in the
                 request's inputs path (so the same calls fault after a restart), crashes
                 (SIGSEGV), hangs or replies garbage, one of the three by the same hash;
                 each call is logged as "<call> <op> <fault or none>" to --log

--op selects which request (describe, forward, backward; default forward) and
--when-seqlen-q N restricts the fault to problems with that seqlen_q, so that a test can
check that the next call, on a fresh worker, succeeds.
"""

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

import attest_worker as aw
import numpy_worker as nw


# The exception both modes raise: the message FlashAttention-4's flash_attn_func gives for a
# FlashAttention-2 keyword.
WRONG_KEYWORD = "flash_attn_func() got an unexpected keyword argument 'return_attn_probs'"


def call_kernel_with_a_wrong_keyword():
    raise TypeError(WRONG_KEYWORD)


def serve_raising(triggered):
    """The NumPy worker under attest_worker.serve, whose triggered calls raise."""
    def handler(op):
        def run(problem, inputs):
            if triggered(op, problem):
                call_kernel_with_a_wrong_keyword()
            return (nw.forward if op == "forward" else nw.backward)(problem, inputs)
        return run
    aw.serve(lambda: ("faulty-exception", nw.CAPABILITIES), handler("forward"),
             handler("backward"))


def answer_by_history(request, problem, handler, proto):
    """--mode history: the correct answer, one ulp higher in every element when the count of
    forward requests this process served before is odd (a backward takes its forward's)."""
    op = request["op"]
    served = getattr(answer_by_history, "served", 0) - (op != "forward")
    answer_by_history.served = served + 1
    outputs = handler(problem, aw.read_inputs(request))
    if served % 2:
        outputs = {k: np.nextafter(v, np.inf).astype(v.dtype) for k, v in outputs.items()}
    aw.write_safetensors(request["outputs"], outputs)
    proto.write('{"status": "ok"}\n')
    proto.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--op", default="forward")
    parser.add_argument("--when-seqlen-q", type=int, default=None)
    parser.add_argument("--pid-file", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()

    def chaos_fault(request):
        """The fault of this call, or None: a hash of (seed, call number), not a stream, so
        that a restarted worker agrees with the one it replaces."""
        call = int(os.path.basename(request["inputs"]).split("-")[0])
        digest = hashlib.sha256(f"{args.seed}:{call}".encode()).digest()
        fault = None
        if int.from_bytes(digest[:8], "little") / 2.0**64 < args.rate:
            fault = ("crash", "hang", "garbage")[digest[8] % 3]
        if args.log:
            with open(args.log, "a") as f:
                f.write(f"{call} {request['op']} {fault or 'none'}\n")
        return fault

    def triggered(op, problem):
        if op != args.op:
            return False
        return args.when_seqlen_q is None or problem["seqlen_q"] == args.when_seqlen_q

    if args.mode == "exception":
        serve_raising(triggered)
        return
    proto = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        problem = request.get("problem")
        if op == "describe":
            if args.op == "describe" and args.mode == "bad-describe":
                proto.write("hello, I am not a protocol reply\n")
            else:
                proto.write(json.dumps({"status": "ok", "name": "faulty-" + args.mode,
                                        "capabilities": nw.CAPABILITIES}) + "\n")
            proto.flush()
            if args.mode == "exit-early":
                sys.stdin.close()
                os._exit(0)
            continue
        handler = nw.forward if op == "forward" else nw.backward
        if args.mode == "history":
            answer_by_history(request, problem, handler, proto)
            continue
        if args.mode == "widen":
            outputs = handler(problem, aw.read_inputs(request))
            aw.write_safetensors(request["outputs"],
                                 {k: np.asarray(v, dtype=np.float64) for k, v in outputs.items()})
            proto.write('{"status": "ok"}\n')
            proto.flush()
            continue
        if args.mode == "strides-ignored":
            inputs = aw.read_inputs(request)
            for name, t in inputs.items():
                if t.view is not None:
                    n = int(np.prod(t.view["shape"]))
                    inputs[name] = aw.Tensor(t.storage[:n].reshape(t.view["shape"]), t.dtype)
            aw.write_safetensors(request["outputs"], handler(problem, inputs))
            proto.write('{"status": "ok"}\n')
            proto.flush()
            continue
        if args.mode == "chaos":
            fault = chaos_fault(request)
            if fault == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif fault == "hang":
                while True:
                    time.sleep(60)
            elif fault == "garbage":
                proto.write("\x00\x01 this is not JSON\n")
            else:
                aw.write_safetensors(request["outputs"],
                                     handler(problem, aw.read_inputs(request)))
                proto.write('{"status": "ok"}\n')
            proto.flush()
            continue
        if not triggered(op, problem):
            aw.write_safetensors(request["outputs"],
                                 handler(problem, aw.read_inputs(request)))
            proto.write('{"status": "ok"}\n')
            proto.flush()
            continue
        mode = args.mode
        print(f"faulty_worker: fault '{mode}' on {op}", file=sys.stderr, flush=True)
        if mode == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif mode == "abort":
            os.abort()
        elif mode == "exit":
            sys.exit(3)
        elif mode in ("hang", "hang-child"):
            if mode == "hang-child":
                child = subprocess.Popen(["sleep", "300"])
                with open(args.pid_file, "w") as f:
                    f.write(str(child.pid))
            while True:
                time.sleep(60)
        elif mode == "garbage":
            proto.write("\x00\x01 this is not JSON\n")
        elif mode == "partial":
            proto.write('{"status": "o')
            proto.flush()
            os._exit(0)
        elif mode == "noise":
            proto.write("loading weights... done\n")
            proto.write('{"status": "ok"}\n')
        elif mode == "no-file":
            proto.write('{"status": "ok"}\n')
        elif mode in ("missing", "wrong-shape", "wrong-dtype"):
            outputs = handler(problem, aw.read_inputs(request))
            first = next(iter(outputs))
            if mode == "missing":
                outputs = {first: outputs[first]}
            elif mode == "wrong-shape":
                outputs[first] = np.ascontiguousarray(outputs[first].T)
            else:
                outputs[first] = aw.Tensor(outputs[first].astype(np.int32), "I32")
            aw.write_safetensors(request["outputs"], outputs)
            proto.write('{"status": "ok"}\n')
        elif mode == "route":
            aw.write_safetensors(request["outputs"],
                                 handler(problem, aw.read_inputs(request)))
            proto.write('{"status": "ok", "route": "slow path"}\n')
        elif mode == "error":
            proto.write(json.dumps({"status": "error", "message": "deliberate failure"}) + "\n")
        elif mode == "error-exit":
            proto.write(json.dumps({"status": "error", "message": "deliberate fatal failure",
                                    "exiting": True}) + "\n")
            proto.flush()
            time.sleep(0.3)
            os._exit(70)
        elif mode == "unsupported":
            proto.write(json.dumps({"status": "unsupported", "reason": "deliberate refusal"})
                        + "\n")
        elif mode == "bad-status":
            proto.write('{"status": "maybe"}\n')
        elif mode == "raise":
            call_kernel_with_a_wrong_keyword()
        else:
            print(f"faulty_worker: unknown mode {mode}", file=sys.stderr)
            sys.exit(2)
        proto.flush()


if __name__ == "__main__":
    main()
