"""A GPU op: initializes the driver when imported, which only its users do."""

from cuda.bindings import driver

(STATUS,) = driver.cuInit(0)
