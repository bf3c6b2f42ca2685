"""`optbench calibrate-bandwidth`: measure this machine's memory bandwidth once, well, into a per-machine file
outside the package (optbench/probes/bandwidth.py), which every later trial's roofline divides by."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optbench.cli.files import check_output
from optbench.cli.options import UsageError
from optbench.job.devices import usable_cpu_cores
from optbench.records import exits


def calibrate_bandwidth_command(args: argparse.Namespace) -> int:
    import torch

    from optbench.probes import bandwidth, stream
    from optbench.records.environment import environment, machine_key
    from optbench.trial.run import device_name, resolve_device

    try:
        bandwidth.check_passes(args.rounds, args.passes)
        device = resolve_device(args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.threads:
        torch.set_num_threads(args.threads)
    cores = usable_cpu_cores()
    if device.type == "cpu" and args.threads and args.threads > cores:
        print(f"optbench: warning: --threads {args.threads} is more than the {cores} cores this process may use: "
              "the ceiling measured is that many threads contending for them", file=sys.stderr)
    machine = machine_key(device)
    path = Path(args.out) if args.out else bandwidth.default_path(machine)
    check_output(path, "--out")
    print(f"optbench calibrate-bandwidth: {args.rounds} rounds x {args.passes} passes of the {stream.KERNEL} kernel "
          f"on {device} ({torch.get_num_threads()} threads)...", file=sys.stderr, flush=True)
    try:
        found = bandwidth.calibrate(device, machine, device_name(device), environment(device), args.rounds,
                                    args.passes)
        if not found.steady and not args.keep_unsteady:
            print(found.describe())
            raise UsageError("calibrate-bandwidth not written: the machine changed speed while it was measured "
                             "(a busy host or neighbour); calibrate again when it is idle")
        bandwidth.save(found, path)
    except bandwidth.BandwidthError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(found.describe())
    kept = "" if found.steady else " as asked, though unsteady: no trial's roofline is shown against it"
    print(f"wrote {path}{kept}" + ("" if args.out is None else f" (trials read it with {bandwidth.FILE_ENV}={path})"))
    return exits.OK
