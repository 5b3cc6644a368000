"""The screen's panels, one widget per file; each holds state and hands drawing to a renderable."""
