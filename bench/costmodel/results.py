"""What the cost model's check scripts put in every result file about the host the runs came from."""
import datetime


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
