# the generate app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/generate/ takes them with it
CKPT ?=
PROMPT ?= The

.PHONY: generate

generate: $(STAMP) ## continue PROMPT with the language model of CKPT=... (configs/charlm.yaml's checkpoints)
	@test -n "$(CKPT)" || { echo "error: say which checkpoint: make generate CKPT=path/to/last.ckpt" >&2; exit 2; }
	$(PY) -m src.apps.generate --ckpt_path "$(CKPT)" --prompt "$(PROMPT)" $(ARGS)
