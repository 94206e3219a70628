"""Building blocks shared by the model families: norms, rotary positions, MLPs, attention blocks."""
