# the sweep app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/sweep/ takes them with it
SPACE ?= src/apps/sweep/digits.yaml
TRIALS ?= 20

.PHONY: sweep postgres

sweep: $(STAMP) ## search SPACE for CONFIG until the study has TRIALS trials (logs/sweeps/; resumable)
	$(PY) -m src.apps.sweep --space $(SPACE) --trials $(TRIALS) --config $(CONFIG) $(ARGS)

postgres: ## install Debian's PostgreSQL server when missing (apt-get): sweeps across machines, their test
	src/apps/sweep/postgres.sh install
