"""Scale-out on the queue: a HorizontalPodAutoscaler (autoscaling/v2) for a bundle's Deployment, on the
per-pod number of waiting requests.

The server exports ``toolcall:num_requests_waiting{model_name}`` (a gauge, runtime/serve/metrics.py).
Prometheus scrapes it from the pods' annotations; the Prometheus adapter turns it into a pods metric of
the custom metrics API, named as ``ADAPTER_RULE`` says (``toolcall_num_requests_waiting``: the API takes
no colons). The HPA keeps the average over the pods near the target (default: the contract's
max_sequences, one full batch waiting a pod), between MIN and MAX replicas; it adds pods quickly and
removes them slowly (the queue of a burst drains in seconds, a new pod takes minutes to load).
"""
from __future__ import annotations

from toolcall.common.errors import EngineError

WAITING_METRIC = "toolcall_num_requests_waiting"
MAX_REPLICAS = 1000
SCALE_DOWN_WINDOW_S = 300
# the Prometheus adapter's rule (its config.yaml, `rules:`) that exposes the gauge as WAITING_METRIC
ADAPTER_RULE = """\
- seriesQuery: 'toolcall:num_requests_waiting{namespace!="",pod!=""}'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: "^toolcall:(.*)$", as: "toolcall_${1}"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""


def parse_range(text: str) -> tuple[int, int]:
    """``MIN:MAX`` replicas, 1 <= MIN <= MAX <= MAX_REPLICAS; EngineError("usage") otherwise."""
    parts = text.split(":")
    try:
        low, high = (int(p) for p in parts) if len(parts) == 2 else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high <= MAX_REPLICAS:
        raise EngineError("usage", f"--autoscale {text!r}: expected MIN:MAX replicas with 1 <= MIN <= MAX <= "
                          f"{MAX_REPLICAS}, e.g. 2:8", option="autoscale", found=text)
    return low, high


def autoscaler(deployment: dict, replicas: tuple[int, int], waiting_per_pod: int) -> dict:
    """The HorizontalPodAutoscaler of ``deployment`` (its name, namespace and labels) for ``replicas`` (MIN, MAX),
    keeping about ``waiting_per_pod`` requests waiting a pod."""
    meta = deployment["metadata"]
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if k in meta},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"]},
            "minReplicas": replicas[0], "maxReplicas": replicas[1],
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": WAITING_METRIC},
                "target": {"type": "AverageValue", "averageValue": str(waiting_per_pod)}}}],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 30}]},
                "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
            },
        },
    }
