"""Side-by-side measurements; `make bench` runs them. Each module says what it measures and how."""
