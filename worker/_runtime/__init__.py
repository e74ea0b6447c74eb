"""What runs inside a worker process and that an application never imports.

    the first code           boot.py          run by its path: yieldstar's packages imported
                                              before anything of the app's folder
    the child process        child.py         load the app once (loading.py), open the ledger,
                                              then serve deliveries over the pipe
    the pipe                 pipe.py          the child's end: framed pickles, as a
                                              multiprocessing Connection reads them
    the messages             protocol.py      Run, Beat, Exit in; Ready (or why not), Alive, Done out
    the parent watch         parent_watch.py  heartbeats answered, an orphan's quick exit
    one delivery             driver.py        run_delivery: replay a workflow, say how it ended
    the writes               fenced.py        every ledger write with the lease's token
    unwinding                unwinding.py     the BaseExceptions that stop a workflow function
    derived ids              derived_ids.py   effect and start-request ids from step keys
    abandoned steps          abandoned.py     step threads past their timeout: the worker is replaced

The SDK that applications import (`worker.registry`'s `@workflow`, the contexts, `retry`,
`stores`, `effects`, `starts`, `client`, `testing`) stays one level up and uses these.
"""
