"""Modal screens: help, rank picker, what-if details."""
