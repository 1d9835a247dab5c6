# the cv app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/cv/ takes them with it
FOLDS ?= 5
SEEDS ?= 3

.PHONY: cv repeat

cv: $(STAMP) ## cross-validate CONFIG over FOLDS folds of the train and validation rows
	$(PY) -m src.apps.cv --folds $(FOLDS) --config $(CONFIG) $(ARGS)

repeat: $(STAMP) ## fit and test CONFIG with SEEDS seeds; mean ± std of the test metrics
	$(PY) -m src.apps.cv --seeds $(SEEDS) --config $(CONFIG) $(ARGS)
