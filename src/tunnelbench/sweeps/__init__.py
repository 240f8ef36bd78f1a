"""Measurements outside a benchmark run, each in labs of its own: the NAT-traversal matrix, the mesh-scale
curve, the impairment engine's ceiling and tax."""
