"""The package version, kept in one place for hatch and for the backpack manifest."""

__version__ = "0.1.0"
