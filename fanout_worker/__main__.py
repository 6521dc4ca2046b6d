from fanout_worker.main import main

main()
