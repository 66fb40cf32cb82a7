"""The model-variant zoo and the response-cache builder (`lmlab cache build` / `lmlab cache show`).

The selection and evaluation areas (cascade_routing, kabb, pmf_predict, cv_winrate) consume one table of per-query
results for a pool of "models" (`lmlab.data.respcache.ResponseCache`). This package makes that pool from the two
real models, without hub access (selection.md, "Model zoo of derived variants"), and fills the table.

It sits above the methods (two variants are pruned by the `wanda` and `atp` methods) and below nothing but the CLI:
the data layer keeps the cache's schema and reader (`lmlab.data.respcache`) and the queries of its suites
(`lmlab.data.respsuite`), and imports nothing from here.

    variants   the zoo's members (`VariantSpec`, `VARIANTS`, `resolve_variants`)
    run        how one variant is built and answers the queries (`run_variant`, `BuildOptions`, `truncated_model`)
    answers    answer keys for self-consistency votes, the safe evaluator of program of thought
    build      the builder (`build_cache`, resumable part files) and `lmlab cache show`'s matrix (`format_matrix`)
"""
