"""What the cost model's check scripts share: the head of every result file (the host the runs came
from) and the one summary they all give, a mean absolute error."""
import datetime
import statistics


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
