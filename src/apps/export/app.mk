# the export app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/export/ takes them with it
CKPT ?=
FORMAT ?= onnx
OUTPUT ?=
OVERWRITE ?=
# make bench runs it with the core's benchmarks
APP_BENCHMARKS += src.apps.export.bench

.PHONY: export

export: $(STAMP) ## export CKPT=... to ONNX (FORMAT=torch-export for .pt2; OUTPUT=path, default beside CKPT; OVERWRITE=1 replaces)
	@test -n "$(CKPT)" || { echo "error: say which checkpoint: make export CKPT=path/to/last.ckpt" >&2; exit 2; }
	$(PY) -m src.apps.export --ckpt_path "$(CKPT)" --format $(FORMAT) $(if $(OUTPUT),--output "$(OUTPUT)") $(if $(OVERWRITE),--overwrite) $(ARGS)
