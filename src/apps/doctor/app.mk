# the doctor app's make targets; the Makefile includes every src/apps/*/app.mk, so deleting
# src/apps/doctor/ takes them with it

.PHONY: doctor

doctor: $(STAMP) ## check CONFIG's model, data and schedule for the silent training bugs (exit 1 on findings)
	$(PY) -m src.apps.doctor --config $(CONFIG) $(ARGS)
