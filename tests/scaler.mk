# Loss scaler: when PyTorch is importable, regenerate the golden sequences with
# torch._amp_update_scale_ and require the committed file to match (the first
# line names the torch version and is not compared).
ci-extra::
	@if python3 -c "import torch" >/dev/null 2>&1; then \
	  mkdir -p $(BUILD) && python3 tests/gen_scaler_ref.py | tail -n +2 > $(BUILD)/scaler_ref.regen && \
	  tail -n +2 tests/data/scaler_ref.txt | cmp -s - $(BUILD)/scaler_ref.regen && \
	  echo "scaler: tests/data/scaler_ref.txt matches torch $$(python3 -c 'import torch; print(torch.__version__)')" || \
	  { echo "scaler: tests/data/scaler_ref.txt differs from torch's output"; exit 1; }; \
	else echo "scaler: torch not importable, golden-file regeneration skipped"; fi
