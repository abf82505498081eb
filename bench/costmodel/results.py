"""What the cost model's check scripts share: the head of every result file (the host the runs came
from), the one summary they all give, a mean absolute error, and where a run counts as
device-bound."""
import datetime
import statistics

# A run whose GPU was busy this share of the time or more (NVML's mean utilisation over the
# measured steps, in percent) is device-bound; below it the host issuing kernels sets its step.
# `zerobench fit --validate` splits its errors by the same threshold
# (costmodel/src/observation.rs, DEVICE_BOUND_UTIL_PCT).
DEVICE_BOUND_UTIL_PCT = 90.0


def header(benchmark, host_txt):
    """The result's head: what it measured, today's date, and the host as bench/gpu/run.sh wrote
    it in host.txt (date, host, GPUs, versions, cores), with its GPU's name."""
    host = [line.strip() for line in open(host_txt) if line.strip()]
    return {
        "benchmark": benchmark,
        "date": datetime.date.today().isoformat(),
        "host": host,
        "gpu": next((line.split(",")[0] for line in host if "NVIDIA" in line), None),
    }


def mean_abs(values, digits=1):
    """The mean absolute value of `values` (errors in percent), rounded to `digits`; None for none."""
    v = [abs(float(x)) for x in values]
    return round(statistics.mean(v), digits) if v else None
