"""Value serialization, snapshots, restore plans and hidden state of cell runs."""
