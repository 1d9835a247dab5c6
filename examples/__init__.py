"""What Lightning hides, written out: the raw loop and manual optimization, each proven equal to the
Trainer."""
