# the serve app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/serve/ takes them with it
CKPT ?=
# make bench runs it with the core's benchmarks
APP_BENCHMARKS += src.apps.serve.bench

.PHONY: serve

serve: PORT = 8000
serve: $(STAMP) ## serve CKPT=... over HTTP on 127.0.0.1 (PORT=8000): POST /predict
	@test -n "$(CKPT)" || { echo "error: say which checkpoint: make serve CKPT=path/to/last.ckpt" >&2; exit 2; }
	$(PY) -m src.apps.serve --ckpt_path "$(CKPT)" --port $(PORT) $(ARGS)
