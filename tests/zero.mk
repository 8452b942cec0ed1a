# The sharded optimizer (capex_zero): tests/test_zero.c shares its checks with
# the MPI test program (tests/mpi/test_dist_mpi.c) through tests/zero_check.h.
$(BUILD)/tests/test_zero: tests/zero_check.h tests/fork_world.h tests/free_port.h
