"""torch's private surface, in one place.

Every use fxckpt makes of an API torch does not promise to keep (modules and
attributes named with a leading underscore, and the code Inductor
generates) goes through this folder; nothing else in fxckpt imports one. The
table says what each is for and what happens where a release lacks it.
Tested on torch 2.11.0, 2.12.1, 2.13.0, 2.14.1 and 2.15.0 (``.ci/run``);
"all" below means each of those.

========================================  ==========================================  ========  ===========================================
API                                       fxckpt needs it for                         releases  where absent
========================================  ==========================================  ========  ===========================================
``torch._ops.OpOverload``,                telling ops from other call targets;        all       -
``OpOverloadPacket``,                     an op's schema (``_schema``: aliasing,
``HigherOrderOperator``                   mutation), overload name, packet name
``torch._subclasses.FakeTensor``,         telling a tracing run from a real one;      all       -
``functional_tensor.FunctionalTensor``,   naming values (``fxckpt.name``)
``torch._from_functional_tensor``
``torch._guards.detect_fake_mode``        the fake mode of a graph's values           all       -
``torch._library.utils.is_impure``        ops that may not run twice                  all       -
``torch._prims.rng_prims``                the RNG-state ops random replay is          all       -
(``run_and_save_rng_state``,              written with
``run_with_rng_state``)
``torch._higher_order_ops.                the buffers a functionalized mutation       all       -
auto_functionalize.get_mutable_args``     writes (CSE keeps them apart)
``torch.utils._pytree``                   flattening inputs and outputs               all       -
``torch.utils._python_dispatch``          the eager checkpoint's dispatch modes;      all       -
(``TorchDispatchMode``,                   measuring CPU convolution scratch off the
``_disable_current_modes``)               tracing modes
``torch.overrides.                        recomputing under the forward's             all       -
_get_current_function_mode_stack``,       ``with torch.device(...)``
``torch.utils._device.DeviceContext``
``torch._C._autograd.                     ``fxckpt.checkpoint`` saving its            2.12+     saved by an autograd node of fxckpt's own,
_make_saved_tensor``, ``SavedTensor``     arguments through enclosing hooks                     as torch 2.11's checkpoint saves its inputs
                                                                                                (``autograd._Packed``)
``SelectiveCheckpointContext``            a policy function's context (public         2.12+     the field set on the context after it is
(its ``op_output`` argument)              class; its constructor changed)                       made
``torch._C._autograd.                     passing saved tensors on to the hooks       all       -
_top_saved_tensors_default_hooks``        around a region
``torch._C._get_graph_exec_group``,       telling one backward from another           all       -
``_current_graph_task_id``
``Variable._execution_engine.             work at the end of a backward (the          all       -
queue_callback``                          step's check, dropping recomputed values)
``torch._C._SetExcludeDispatchKeyGuard``  aliases without autograd view tracking      all       -
``torch._C._autograd._profiler_enabled``  measuring CPU convolution scratch in a      all       -
                                          helper process while a profiler runs
``torch._C._dispatch_get_all_op_names``   suggesting op names in policy errors        all       -
``Tensor._version``,                      in-place writes seen; storage identity      all       -
``untyped_storage()._cdata``
``nn.Module._buffers``,                   undoing buffer updates; telling module      all       -
``nn.Module._call_impl``                  frames apart
``torch._dynamo.backends.common.          AOTAutograd under fxckpt's partitioner      all       -
aot_autograd``, ``debugging.boxed_nop``
``torch._functorch.config``               torch's partitioner settings (its           all       -
                                          classes), lowering, caches
``torch._functorch.partitioners``         extracting forward and backward;            all       -
(``_extract_fwd_bwd_modules``,            torch's op lists; torch's partitions in
``get_default_op_list``, partitions)      the bench
``torch.fx._lazy_graph_module``,          graph modules whose code is made when       all       -
``Graph._codegen``                        read; copies keeping input structure
``torch._dynamo.eval_frame.               ``fxckpt.compile``'s module                 all       -
OptimizedModule``
``torch._dynamo.exc.ShortenTraceback``    errors Dynamo re-raises unwrapped           all       -
``torch._dynamo.utils.                    every graph break, empty graphs too         all       the breaks handed to the backend only
graph_break_reasons``
``torch.compile(isolate_recompiles=)``    explain/pareto captures kept apart from     2.13+     captured as a plain compile, which counts
                                          the user's compiles                                   against Dynamo's recompile limit (said once)
``Node._dynamo_source``,                  planning a Dynamo graph again               all       -
``GraphModule._param_name_to_source``
``_boxed_call``                           AOTAutograd's boxed calling convention      all       -
``torch._inductor.config``                the custom partitioner, post-grad passes,   all       -
                                          loop tails, realize thresholds
``torch._inductor.compile_fx``            compiling the planned graphs                all       -
``torch._inductor.custom_graph_pass``     fxckpt's partitioner and addmm split        all       -
(``CustomPartitionerFn``,
``CustomGraphPass``)
``custom_graph_pass.                      running the user's post-grad passes         2.13+     the user's pass and fxckpt's run as one
get_custom_graph_passes``                 beside fxckpt's
``torch._inductor.virtualized.V``         fusion choices that keep recomputation      all       -
(``set_choices_handler``, ``choices``)    apart; the scheduler's nodes
``torch._inductor.runtime.                where plans are cached                      all       -
cache_dir_utils.cache_dir``
Inductor's wrapper code                   compiled peaks (``wrapper_code``)           all       a statement not known stops the reading:
                                                                                                the memory model's peak stands, said once
========================================  ==========================================  ========  ===========================================

Releases: ``releases.py`` (a release newer than the newest tested imports
with one warning; one older than 2.11 does not import).
"""
