"""Leader election with the official Kubernetes Python client, as another service would run it.

Runs `kubernetes.leaderelection` with a `LeaseLock` on one Lease and appends one line per event to
a log shared with other processes: `<CLOCK_MONOTONIC ns> <identity> <event>`, where event is

- `start` when it became leader (its work begins), `end` when its work is done,
- `renew` after each successful write of the Lease while leading (the first is the acquisition),
- `lost` when it could not renew (leader election gave up).

It prints `leading` on stdout once it leads. After `--work` seconds of leading it logs `end` and
exits at once, without releasing: the Lease stays held until its leaseDurationSeconds pass with no
renewal, as when a pod dies. Losing the lease exits with status 3.
"""

import argparse
import os
import sys
import time

from kubernetes import config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--name", required=True, help="the Lease name")
    p.add_argument("--identity", required=True)
    p.add_argument("--log", required=True, help="the shared event log")
    p.add_argument("--work", type=float, required=True, help="seconds of work while leading")
    p.add_argument("--lease-duration", type=int, default=3)
    p.add_argument("--renew-deadline", type=int, default=2)
    p.add_argument("--retry-period", type=int, default=1)
    a = p.parse_args()

    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event):
        # One write(2) per line on an O_APPEND file: lines of several processes never mix.
        os.write(fd, f"{time.monotonic_ns()} {a.identity} {event}\n".encode())

    class LoggedLeaseLock(LeaseLock):
        def update(self, name, namespace, updated_record):
            ok = super().update(name, namespace, updated_record)
            if ok and updated_record.holder_identity == self.identity:
                log("renew")
            return ok

        def create(self, name, namespace, election_record):
            ok = super().create(name, namespace, election_record)
            if ok:
                log("renew")
            return ok

    def lead():
        log("start")
        print("leading", flush=True)
        time.sleep(a.work)  # the work itself, not a wait for anything
        log("end")
        os._exit(0)

    def stopped():
        log("lost")
        os._exit(3)

    config.load_kube_config(config_file=a.kubeconfig)
    lock = LoggedLeaseLock(a.name, a.namespace, a.identity)
    cfg = electionconfig.Config(
        lock,
        lease_duration=a.lease_duration,
        renew_deadline=a.renew_deadline,
        retry_period=a.retry_period,
        onstarted_leading=lead,
        onstopped_leading=stopped,
    )
    leaderelection.LeaderElection(cfg).run()
    # run() returns only after leading stopped; stopped() has exited already.
    sys.exit(4)


if __name__ == "__main__":
    main()
