"""Several real nodes on loopback: the embedded brokers as one fleet."""
