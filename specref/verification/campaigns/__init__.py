"""Many checks at once: plans (N and time per case) and sweeps (a grid of cases and settings
recorded as one resumable JSON file)."""
