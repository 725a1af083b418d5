"""Test harnesses: the object-level driver, seeded bugs, the fuzz harness.  They import the
product; the product never imports them."""
