"""`tandem autoscaler`: each pool sized on its own signal (decode on KV utilisation, prefill on TTFT)."""
