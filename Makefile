# resnet-tpu: `make demo` and `make test` work on a fresh machine (they create
# .venv from requirements.txt first).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DATA := demo_data
DEMO_RUN := runs/demo

.PHONY: venv test demo bench bench-cpu-kernels profile-ops study clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

venv: $(VENV)/.installed

test: venv
	$(PY) -m pytest -q --durations=15

demo: venv
	rm -rf $(DEMO_RUN) $(DEMO_DATA)
	$(PY) -m data.make_synthetic --output_dir=$(DEMO_DATA)/images \
	    --num_classes=10 --images_per_class=200 \
	    --validation_images_per_class=25 --image_size=40
	$(PY) -m data.build_tfrecords --input_dir=$(DEMO_DATA)/images/train \
	    --output_dir=$(DEMO_DATA)/tfrecords --split=train --num_shards=4
	$(PY) -m data.build_tfrecords --input_dir=$(DEMO_DATA)/images/validation \
	    --output_dir=$(DEMO_DATA)/tfrecords --split=validation --num_shards=2
	$(PY) main.py --flagfile=flags/cpu_demo.cfg \
	    --data_dir=$(DEMO_DATA)/tfrecords --model_dir=$(DEMO_RUN)
	$(PY) tools/export_savedmodel.py --model_dir=$(DEMO_RUN) \
	    --export_dir=$(DEMO_RUN)/export
	$(PY) tools/evaluate.py --saved_model=$(DEMO_RUN)/export \
	    --data_dir=$(DEMO_DATA)/tfrecords
	$(PY) tools/plot_metrics.py --model_dir=$(DEMO_RUN)
	@echo "Checkpoints and metrics.jsonl: $(DEMO_RUN)/"
	@echo "TensorBoard logs: tensorboard --logdir $(DEMO_RUN)"
	@echo "SavedModel: $(DEMO_RUN)/export   Plot: $(DEMO_RUN)/metrics.png"

# Each benchmark alternates its variants and merges its headline ratios into
# bench_results/summary.json; bench_report assembles REPORT.md.
bench: venv
	$(PY) -m tools.bench_train --output_dir=bench_results
	$(PY) -m tools.bench_bn_groups --output_dir=bench_results
	$(PY) -m tools.bench_collectives --output_dir=bench_results
	$(PY) -m tools.bench_input --output_dir=bench_results
	$(PY) -m tools.allreduce_sim --output_dir=bench_results
	$(PY) -m tools.bench_report --output_dir=bench_results

# oneDNN vs Eigen CPU kernels (why resnet_tpu/cpu_kernels.py turns oneDNN
# on): one process per sample, about 3.5 minutes, so not part of `bench`.
bench-cpu-kernels: venv
	$(PY) -m tools.bench_cpu_kernels --output_dir=bench_results
	$(PY) -m tools.bench_report --output_dir=bench_results

# Op time per category of the float32 ResNet-50 steps and of the BN-group
# steps (tools/op_profile.py): about 5 minutes, so not part of `bench`.
profile-ops: venv
	$(PY) -m tools.op_profile --workloads=ours,ours_v1_layout,keras \
	    --output_dir=bench_results
	$(PY) -m tools.op_profile --workloads=bn_group1,bn_group4,bn_group8 \
	    --output_dir=bench_results
	$(PY) -m tools.bench_report --output_dir=bench_results

# The papers' central claims on real photos (tools/study.py): Fashion-MNIST
# from Debian's dataset-fashion-mnist, about 90 minutes on 2 CPU cores; it
# prints its estimate first.
study: venv
	$(PY) -m tools.study --output_dir=bench_results/studies

clean:
	rm -rf $(DEMO_RUN) $(DEMO_DATA) bench_results/*.tmp
