# The whole mixed-precision loop over ranks (scaler, clipping, AdamW, schedule,
# DDP and ZeRO 1/2, checkpoints): tests/test_amp_loop.c forks TCP worlds.
$(BUILD)/tests/test_amp_loop: tests/amp_loop.h tests/fork_world.h tests/free_port.h
