"""Test markers: the inner loop is ``pytest -m "not slow and not integration"`` (under 2 minutes
on 2 cores); ``.ci/run`` runs everything.

- ``integration``: starts something real beside the test process: an HTTP server on loopback,
  Redis, a local Ray cluster, or the ``adaptspec`` CLI in a subprocess. Whole files that do are
  listed in :data:`INTEGRATION_FILES`; a test elsewhere carries the marker itself.
- ``slow``: takes more than a few seconds on 2 cores (loads the bundled target, trains, or
  decodes many tokens); marked on the test, or listed in :data:`SLOW_TESTS` from a measured run.
"""

from __future__ import annotations

import pytest

#: Files whose every test starts a server, Redis, Ray or a CLI subprocess.
INTEGRATION_FILES = {
    "test_client_disconnect.py",
    "test_examples.py",
    "test_fleet_ab.py",
    "test_fleet_identity.py",
    "test_fleet_lease_metrics.py",
    "test_fleet_redis.py",
    "test_fleet_serve.py",
    "test_openai_client.py",
    "test_ray.py",
    "test_serving.py",
}

#: Tests measured at 2 s or more (call + setup) in a full run on the shared 2 cores (2026-12-02;
#: those of 2026-12-03 at 1.5 s or more on a host running at half speed),
#: by node id without parameters; the fast subset leaves them out.
SLOW_TESTS = {
    "adaptspec/batching/engine.py::adaptspec.batching.engine",
    "adaptspec/decoding/decoder.py::adaptspec.decoding.decoder",
    "tests/test_ab_never_5xx.py::test_ab_never_5xx_with_or_without_checkpoints",
    "tests/test_architecture.py::test_every_package_has_a_layer_and_imports_only_lower_layers",
    "tests/test_architecture.py::test_import_adaptspec_is_cheap_and_public_names_resolve",
    "tests/test_bad_input_cli.py::test_bad_input_is_one_line_exit_2_and_changes_nothing",
    "tests/test_bad_input_cli.py::test_train_drafter_work_dir_with_a_bad_data_json_is_one_line",
    "tests/test_bad_input_files.py::test_serve_refuses_a_truncated_checkpoint_at_start",
    "tests/test_bad_input_files.py::test_traces_derive_refuses_an_impossible_accept_and_writes_nothing",
    "tests/test_bad_input_files.py::test_train_head_onto_a_full_disk_is_one_line",
    "tests/test_batching.py::test_fast_mode_argmax_under_random_compositions",
    "tests/test_batching.py::test_sampling_is_exact_in_distribution",
    "tests/test_batching_exact.py::test_greedy_rows_equal_the_target_alone",
    "tests/test_batching_exact.py::test_staggered_joins_with_accepted_drafts",
    "tests/test_bundled.py::test_fast_verification_is_plain_decoding_at_b1_and_differs_only_at_near_ties",
    "tests/test_bundled.py::test_greedy_output_equals_the_targets_own",
    "tests/test_bundled.py::test_sampling_is_reproducible",
    "tests/test_cli_sim.py::test_subprocess_json_and_error",
    "tests/test_collection.py::test_collect_every_arm_with_real_stats",
    "tests/test_collection.py::test_parts_and_resume_give_the_same_trace_set",
    "tests/test_controller.py::test_sigkill_loses_no_acknowledged_decision_and_resumes_exactly",
    "tests/test_controller_full_info.py::test_a_crash_resumes_the_full_information_state_exactly",
    "tests/test_corpus.py::test_corpus_grows_resumes_and_refuses_foreign_dirs",
    "tests/test_decoding.py::test_every_block_size_with_a_perturbed_drafter",
    "tests/test_decoding.py::test_greedy_equals_target_generate_untrained_drafter",
    "tests/test_decoding.py::test_greedy_equals_target_generate_with_accepting_drafter",
    "tests/test_decoding.py::test_sampling_keeps_the_target_distribution",
    "tests/test_decoding.py::test_stops_at_eos_and_at_max_tokens",
    "tests/test_dense.py::test_replay_equals_the_real_decoder_round_by_round",
    "tests/test_dflash_format.py::test_a_drafter_whose_drafts_are_accepted_matches_the_reference_round_by_round",
    "tests/test_dflash_format.py::test_bfloat16_drafts_agree_with_the_reference_and_decoding_stays_lossless",
    "tests/test_dflash_format.py::test_every_round_drafts_and_accepts_what_the_reference_does",
    "tests/test_drafter_data.py::test_every_position_tau_equals_the_decoding_paths_drafts",
    "tests/test_drafter_data.py::test_training_on_recomputed_contexts_raises_acceptance",
    "tests/test_early_refusals.py::test_a_fifo_in_a_trace_set_is_refused_not_read",
    "tests/test_evaluation.py::test_drift_recovery_detected",
    "tests/test_evaluation.py::test_report_written_and_sections_carried_over",
    "tests/test_evaluation_under_load.py::test_the_report_renders_section_8_from_results_and_carries_it_over",
    "tests/test_evaluation_under_load.py::test_the_section_measures_the_odd_half_and_tunes_on_the_even_half",
    "tests/test_fast_verification.py::test_every_committed_token_is_the_argmax_of_the_pass_that_verified_it",
    "tests/test_fast_verification.py::test_output_equals_plain_greedy_except_at_near_ties",
    "tests/test_fast_verification.py::test_sampling_keeps_the_verifying_pass_distribution",
    "tests/test_fleet_replay.py::test_four_replicas_learn_about_four_times_sooner",
    "tests/test_jsonlines.py::test_a_torn_tail_cut_at_any_byte_reads_back_as_the_complete_lines",
    "tests/test_load_context.py::test_batched_decisions_log_their_load_and_attribution_and_decide_on_the_load",
    "tests/test_load_rules.py::test_learning_corrects_a_cost_model_that_thinks_long_blocks_are_free",
    "tests/test_load_sim.py::test_the_learned_rule_finds_each_load_levels_best_block_size",
    "tests/test_machine_speed.py::test_a_uniformly_slower_or_faster_machine_leaves_every_choice_unchanged",
    "tests/test_policies_head.py::test_head_learns_a_nonlinear_optimum_and_beats_fixed",
    "tests/test_ridge_kernels_readonly.py::test_the_kernels_compile_without_a_cache_locator_and_compute_the_closed_forms",
    "tests/test_schedules.py::test_decoder_output_is_greedy_under_any_schedule",
    "tests/test_seeded_sampling.py::test_the_engine_gives_the_same_samples_whatever_the_rule_and_the_batch",
    "tests/test_serving_batched.py::test_a_load_rule_chooses_every_round_capped_by_each_requests_own_block_size",
    "tests/test_serving_batched.py::test_a_real_batched_server_serves_concurrent_clients_exactly",
    "tests/test_statistics.py::test_type_one_error_holds_under_continuous_monitoring",
    "tests/test_stops.py::test_generation_ends_at_the_first_stop_whatever_the_block_size",
    "tests/test_switchback.py::test_a_served_switchback_gives_each_request_its_slices_variant_and_ab_report_reads_the_slices",
    "tests/test_synthetic.py::test_cpu_small_is_calibrated_to_this_machine",
    "tests/test_synthetic.py::test_dflash_gpu_is_calibrated_to_published_figures",
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds on 2 cores")
    config.addinivalue_line("markers", "integration: starts a server, Redis, Ray or a CLI subprocess")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in INTEGRATION_FILES:
            item.add_marker(pytest.mark.integration)
        if item.nodeid.split("[")[0] in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
