"""Runtime: the PJRT platform, device storage and host transfers."""
