"""What ``tlxform bench`` runs: the paper's shapes, baselines, JSON records and PNG charts."""
