"""The performance lab: what bench.py times (cases), how (measure), its reports, the regression check, and the
micro-batch that fits a device (autobatch)."""
