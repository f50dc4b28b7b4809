"""rollout_ray (API assembled in progress)."""
