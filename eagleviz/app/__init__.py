"""The page: Gradio wiring (`ui`) and what it does. Imports decoding, perf, visuals and models; nothing
below imports it.

    ui          build_app: layout first, events second
    handlers    runs, races, trace files          navigation  cycles, phases, the selected token
    workshop    share links, recorded runs, projector          share / gallery  links and recorded runs
    session     knobs -> a streamed run on a shared engine     pairs  the model/head pairs a server offers
    presets     the page's prompt presets          limits / flags  what a shared server allows, launch flags
"""
