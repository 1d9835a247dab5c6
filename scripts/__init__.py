"""Tools for the repository itself: ``make slim`` (:mod:`scripts.slim`) and the pages' link check
(:mod:`scripts.links`). Standard library and PyYAML only; none of them is part of a run."""
