"""What many tests share, in one place: frames and sources made by hand (:mod:`helpers.frames`) and how long a
test waits for a condition (:mod:`helpers.waits`). Real jobs run by :mod:`ranks`; hosts made by :mod:`hosts`."""
