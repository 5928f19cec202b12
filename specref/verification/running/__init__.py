"""Running checks: calling an implementation so that every misbehaviour becomes a status, the
one case runner every level goes through, settings and reports, progress bars."""
