"""A script never ported to platoon: it computes and exits 0 without creating a Worker."""

print("UNPORTED: trained alone, never created a Worker", flush=True)
